"""RemoteStore backends: any fsspec file system and S3, and `open_remote` for every URL.

Local/NFS paths (and vrl repositories used as remotes): vrl/remote/local.py.

Backends are imported lazily, so `vrl remote list` and friends stay fast and a missing
optional dependency only matters for the scheme that needs it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from vrl.errors import RefConflictError
from vrl.remote.base import LOCK_TIMEOUT, KeyMissing, RemoteStore, is_temp_key, redact, too_large
from vrl.remote.credentials import CREDENTIAL_HINT, embeds_secret, find_secret, is_secret_option
from vrl.remote.errors import MissingBackendError, RemoteConfigError
from vrl.remote.local import LocalRemote

STALE_LOCK_AGE = 60.0
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 120.0

# One exclusive-create at a time per process: the in-memory fs checks and creates in two
# steps, so without this two threads could both "win" a lock.
_CREATE_LOCK = threading.Lock()


def _looks_like_exists(exc: BaseException) -> bool:
    """True if an exclusive create failed because the file is there (SFTP reports this as
    a generic failure whose text says so)."""
    return isinstance(exc, FileExistsError) or getattr(exc, "errno", None) == errno.EEXIST \
        or "exists" in str(exc).lower()



# ------------------------------------------------------------------------------ any fsspec fs


class FsspecRemote(RemoteStore):
    """Any fsspec file system (SFTP, in-memory, GCS, Azure, ...).

    Guarantee: objects are written to a temp name and renamed, so a reader never sees a
    partial file; refs move under a lock file taken with exclusive create. That is atomic
    on SFTP (O_EXCL + posix-rename) and within one process for memory://. Object stores
    (S3, GCS, Azure: subclasses below) set `direct_writes`: a whole-object upload is atomic
    there, and a rename is a copy plus a delete (two more requests per object).
    """

    direct_writes = False

    def __init__(self, fs: Any, root: str, url: str, guarantee: str = "") -> None:
        self.fs = fs
        self.root = fs._strip_protocol(root).rstrip("/") if root else ""
        self.url = url
        self.guarantee = guarantee or "lock file (exclusive create) + rename"
        self._made: set[str] = set()

    def _p(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def _parent(self, path: str) -> str:
        return path.rsplit("/", 1)[0]

    def _makedirs(self, path: str) -> None:
        parent = self._parent(path)
        if parent and parent not in self._made:
            with contextlib.suppress(FileExistsError):
                self.fs.makedirs(parent, exist_ok=True)
            self._made.add(parent)

    def get(self, key: str) -> bytes:
        with self.guard(f"reading {key}"):
            try:
                return self.fs.cat_file(self._p(key))
            except FileNotFoundError:
                raise KeyMissing(key) from None

    def get_range(self, key: str, start: int, end: int) -> bytes:
        with self.guard(f"reading {key}"):
            try:
                with self.fs.open(self._p(key), "rb") as f:
                    f.seek(start)
                    parts = []
                    want = end - start
                    while want > 0:  # an SFTP read returns at most one block
                        chunk = f.read(want)
                        if not chunk:
                            break
                        parts.append(chunk)
                        want -= len(chunk)
                    return b"".join(parts)
            except FileNotFoundError:
                raise KeyMissing(key) from None

    def list_sizes(self, prefix: str) -> dict[str, int]:
        with self.guard(f"listing {prefix}"):
            base = self._p(prefix).rstrip("/")
            with contextlib.suppress(AttributeError):
                self.fs.invalidate_cache()
            try:
                found = self.fs.find(base, detail=True)
            except FileNotFoundError:
                return {}
            start = len(self.root) + 1 if self.root else 0
            out = {}
            for path, info in found.items():
                path = self.fs._strip_protocol(path)
                if not is_temp_key(path) and info.get("size") is not None:
                    out[path[start:]] = int(info["size"])
            return out

    def get_small(self, key: str, limit: int, what: str = "object") -> bytes:
        with self.guard(f"reading {key}"):
            try:
                with self.fs.open(self._p(key), "rb") as f:
                    data = f.read(limit + 1)
            except FileNotFoundError:
                raise KeyMissing(key) from None
        if len(data) > limit:
            raise too_large(key, self.url, limit, what)
        return data

    def _temp_for(self, path: str) -> str:
        return f"{self._parent(path)}/.tmp-{os.getpid()}-{secrets.token_hex(6)}"

    def _commit_temp(self, tmp: str, final: str) -> None:
        try:
            self.fs.mv(tmp, final)
        except Exception:
            with contextlib.suppress(Exception):
                self.fs.rm_file(tmp)
            raise

    def put(self, key: str, data: bytes) -> None:
        with self.guard(f"writing {key}"):
            final = self._p(key)
            if self.direct_writes:
                self.fs.pipe_file(final, data)
                return
            self._makedirs(final)
            tmp = self._temp_for(final)
            self.fs.pipe_file(tmp, data)
            self._commit_temp(tmp, final)

    def put_file(self, key: str, local: Path) -> None:
        with self.guard(f"writing {key}"):
            final = self._p(key)
            if self.direct_writes:
                self.fs.put_file(str(local), final)
                return
            self._makedirs(final)
            tmp = self._temp_for(final)
            self.fs.put_file(str(local), tmp)
            self._commit_temp(tmp, final)

    def exists(self, key: str) -> bool:
        with self.guard(f"checking {key}"):
            return bool(self.fs.exists(self._p(key)))

    def list(self, prefix: str) -> list[str]:
        with self.guard(f"listing {prefix}"):
            base = self._p(prefix).rstrip("/")
            with contextlib.suppress(AttributeError):
                self.fs.invalidate_cache()
            try:
                found = self.fs.find(base)
            except FileNotFoundError:
                return []
            start = len(self.root) + 1 if self.root else 0
            out = []
            for path in found:
                path = self.fs._strip_protocol(path)
                if not is_temp_key(path):
                    out.append(path[start:])
            return sorted(out)

    def delete(self, key: str) -> None:
        with self.guard(f"deleting {key}"), contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._p(key))

    def read_versioned(self, key: str) -> tuple[bytes | None, Any]:
        try:
            data = self.get(key)
        except KeyMissing:
            return None, None
        return data, data

    @contextlib.contextmanager
    def _lock(self, key: str) -> Iterator[None]:
        lock = self._p(key) + ".lock"
        self._makedirs(lock)
        deadline = time.monotonic() + LOCK_TIMEOUT
        delay = 0.005
        vanished = 0
        while True:
            try:
                with _CREATE_LOCK, self.fs.open(lock, "xb") as f:
                    f.write(f"{time.time():.3f} {socket.gethostname()} {os.getpid()}".encode())
                break
            except Exception as exc:  # noqa: BLE001 - each fs reports "exists" differently
                if not _looks_like_exists(exc) and not self.fs.exists(lock):
                    # Either the holder released between our create and this check (a
                    # race: retry), or the create fails for another reason (it keeps
                    # failing with no lock there: report it).
                    vanished += 1
                    if vanished > 3:
                        raise exc
                    continue
            if self._break_stale(lock):
                continue
            if time.monotonic() > deadline:
                raise RefConflictError(f"{key} on {redact(self.url)} is locked by another "
                                       f"pusher ({lock}); if none is running, delete the lock "
                                       "and retry")
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                self.fs.rm_file(lock)

    def _break_stale(self, lock: str) -> bool:
        try:
            stamp = float(self.fs.cat_file(lock).split()[0])
        except FileNotFoundError:
            return True
        except (ValueError, IndexError):
            stamp = 0.0  # torn or empty: stale once old enough to rule out a slow writer
        if time.time() - stamp > STALE_LOCK_AGE:
            with contextlib.suppress(Exception):
                self.fs.rm_file(lock)
            return True
        return False

    def swap(self, key: str, data: bytes, expected: Any) -> None:
        with self.guard(f"updating {key}"), self._lock(key):
            current, _ = self.read_versioned(key)
            if current != expected:
                raise RefConflictError(f"{key} on {redact(self.url)} changed meanwhile")
            self.put(key, data)


# ------------------------------------------------------------------------------ S3


def _error_code(exc: BaseException) -> str:
    cur: BaseException | None = exc
    for _ in range(5):
        if cur is None:
            break
        response = getattr(cur, "response", None)
        if isinstance(response, dict):
            return str(response.get("Error", {}).get("Code", ""))
        cur = cur.__cause__ or cur.__context__
    return ""


class ConditionalRemote(FsspecRemote):
    """An object store (S3, GCS, Azure): an upload is atomic, so objects are written in
    place; refs move by the store's conditional writes (`read_versioned` / `swap`, each
    backend's own), so exactly one of several racing pushers wins."""

    direct_writes = True

    def __init__(self, fs: Any, root: str, url: str, guarantee: str) -> None:
        super().__init__(fs, root, url, guarantee)
        self.bucket, _, self.prefix = self.root.partition("/")

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _sync(self, func: Any, *args: Any) -> Any:
        from fsspec.asyn import sync

        return sync(self.fs.loop, func, *args)

    def get(self, key: str) -> bytes:
        # one GET (s3fs's cat_file sends a HEAD first, to decide on concurrent ranges)
        data, _ = self.read_versioned(key)
        if data is None:
            raise KeyMissing(key)
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        with self.guard(f"reading {key}"):  # one GET with a Range header
            try:
                return self.fs.cat_file(self._p(key), start=start, end=end)
            except FileNotFoundError:
                raise KeyMissing(key) from None


class S3Remote(ConditionalRemote):
    """An S3 bucket/prefix (AWS or any S3-compatible endpoint) through s3fs.

    Guarantee: a PUT is atomic, so objects are written in place; refs move by conditional
    writes (`If-Match` on the ETag read, `If-None-Match: *` to create), which S3 evaluates
    atomically, so exactly one of several racing pushers wins. Endpoints without
    conditional-write support reject or ignore the header: use one pusher per branch there.
    """

    def __init__(self, fs: Any, root: str, url: str) -> None:
        super().__init__(fs, root, url, "atomic (S3 conditional writes: If-Match / "
                                        "If-None-Match)")

    def exists(self, key: str) -> bool:
        with self.guard(f"checking {key}"):
            try:
                self.fs.call_s3("head_object", Bucket=self.bucket, Key=self._key(key))
                return True
            except FileNotFoundError:
                return False

    def read_versioned(self, key: str) -> tuple[bytes | None, Any]:
        async def fetch() -> tuple[bytes, str]:
            resp = await self.fs._call_s3("get_object", Bucket=self.bucket,
                                          Key=self._key(key))
            async with resp["Body"] as body:
                data = await body.read()
            return data, resp["ETag"]

        with self.guard(f"reading {key}"):
            try:
                return self._sync(fetch)
            except FileNotFoundError:
                return None, None

    def swap(self, key: str, data: bytes, expected: Any) -> None:
        condition = {"IfMatch": expected} if expected else {"IfNoneMatch": "*"}
        try:
            with self.guard(f"updating {key}"):
                try:
                    self.fs.call_s3("put_object", Bucket=self.bucket, Key=self._key(key),
                                    Body=data, **condition)
                except Exception as exc:
                    code = _error_code(exc)
                    if code in ("PreconditionFailed", "ConditionalRequestConflict", "412",
                                "409") or isinstance(exc, FileExistsError) or \
                            (expected and isinstance(exc, FileNotFoundError)):
                        raise RefConflictError(f"{key} on {redact(self.url)} changed "
                                               "meanwhile") \
                            from None
                    raise
        finally:
            self.fs.invalidate_cache(self._p(key))


# ------------------------------------------------------------------------------ GCS


def _conflict(key: str, url: str) -> RefConflictError:
    return RefConflictError(f"{key} on {redact(url)} changed meanwhile")


class GcsRemote(ConditionalRemote):
    """A GCS bucket/prefix through gcsfs (its JSON-API class, `gcsfs.core.GCSFileSystem`).

    Guarantee: an upload is atomic, so objects are written in place; refs move by
    generation preconditions (`ifGenerationMatch` on the generation read, `0` to create),
    which GCS evaluates atomically: exactly one of several racing pushers wins.
    """

    def __init__(self, fs: Any, root: str, url: str) -> None:
        super().__init__(fs, root, url, "atomic (GCS generation preconditions)")

    def read_versioned(self, key: str) -> tuple[bytes | None, Any]:
        # one GET: the body and the generation it belongs to (x-goog-generation)
        with self.guard(f"reading {key}"):
            try:
                headers, data = self.fs.call("GET", "b/{}/o/{}", self.bucket, self._key(key),
                                             alt="media")
            except FileNotFoundError:
                return None, None
        return data, headers.get("x-goog-generation")

    def swap(self, key: str, data: bytes, expected: Any) -> None:
        # gcsfs's uploads take no generation but 0 (mode="create"): a multipart upload
        # (metadata + body, one request) with the precondition, as gcsfs sends its own
        async def upload() -> None:
            meta = json.dumps({"name": self._key(key)}).encode()
            body = (b"--==vrl==\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n" + meta
                    + b"\r\n--==vrl==\r\nContent-Type: application/octet-stream\r\n\r\n" + data
                    + b"\r\n--==vrl==--")
            await self.fs._call("POST", f"{self.fs._location}/upload/storage/v1/b/{{}}/o",
                                self.bucket, uploadType="multipart",
                                ifGenerationMatch=str(expected or 0), data=body,
                                headers={"Content-Type": 'multipart/related; boundary="==vrl=="'})

        if expected and not str(expected).isdigit():  # not a generation this store gave out
            raise _conflict(key, self.url)
        try:
            with self.guard(f"updating {key}"):
                try:
                    self._sync(upload)
                except Exception as exc:
                    # 412 Precondition Failed: gcsfs raises FileExistsError for it
                    if isinstance(exc, FileExistsError) or getattr(exc, "code", None) == 412:
                        raise _conflict(key, self.url) from None
                    raise
        finally:
            self.fs.invalidate_cache(self._p(key))


# ------------------------------------------------------------------------------ Azure


class AzureRemote(ConditionalRemote):
    """An Azure Blob container/prefix through adlfs.

    Guarantee: a blob upload is atomic, so objects are written in place; refs move by
    conditional writes (`If-Match` on the ETag read, `If-None-Match: *` to create), which
    Azure evaluates atomically: exactly one of several racing pushers wins.
    """

    def __init__(self, fs: Any, root: str, url: str) -> None:
        super().__init__(fs, root, url, "atomic (Azure conditional writes: If-Match / "
                                        "If-None-Match)")
        self.container = self.bucket

    def read_versioned(self, key: str) -> tuple[bytes | None, Any]:
        from azure.core.exceptions import ResourceNotFoundError

        async def fetch() -> tuple[bytes | None, Any]:
            async with self.fs.service_client.get_blob_client(self.container,
                                                              self._key(key)) as blob:
                try:
                    stream = await blob.download_blob()
                except ResourceNotFoundError:
                    return None, None
                return await stream.readall(), stream.properties.etag

        with self.guard(f"reading {key}"):
            return self._sync(fetch)

    def swap(self, key: str, data: bytes, expected: Any) -> None:
        from azure.core import MatchConditions
        from azure.core.exceptions import (
            ResourceExistsError,
            ResourceModifiedError,
            ResourceNotFoundError,
        )

        async def upload() -> None:
            async with self.fs.service_client.get_blob_client(self.container,
                                                              self._key(key)) as blob:
                if expected:
                    await blob.upload_blob(data, overwrite=True, etag=expected,
                                           match_condition=MatchConditions.IfNotModified)
                else:  # If-None-Match: *
                    await blob.upload_blob(data, overwrite=False)

        try:
            with self.guard(f"updating {key}"):
                try:
                    self._sync(upload)
                except (ResourceModifiedError, ResourceExistsError, ResourceNotFoundError):
                    raise _conflict(key, self.url) from None
        finally:
            self.fs.invalidate_cache(self._p(key))


# ------------------------------------------------------------------------------ URLs

SCHEMES = ("file", "memory", "s3", "ssh", "sftp", "gs", "gcs", "az", "abfs")
_EXTRAS = {"s3": ("s3fs", "s3"), "ssh": ("sshfs", "ssh"), "sftp": ("sshfs", "ssh"),
           "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"), "az": ("adlfs", "azure"),
           "abfs": ("adlfs", "azure")}


def check_url(url: str) -> str:
    """Validate a remote URL without contacting it; return it unchanged."""
    if not url or url != url.strip() or any(c in url for c in "\n\r\t\x00"):
        raise RemoteConfigError(f"invalid remote URL {redact(url)!r}")
    if embeds_secret(url):
        raise RemoteConfigError(f"remote URL {redact(url)} embeds a credential; "
                                + CREDENTIAL_HINT)
    if "://" not in url:
        if ":" in url.split("/", 1)[0] and not url.startswith(("/", ".", "~")):
            raise RemoteConfigError(
                f"invalid remote URL {redact(url)!r}: scp-style host:path is not supported; "
                "use ssh://host/path")
        return url
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise RemoteConfigError(f"unsupported remote URL scheme {scheme + '://'!r} in "
                                f"{redact(url)}; use a path or one of "
                                + ", ".join(s + "://" for s in SCHEMES))
    if scheme in ("s3", "gs", "gcs", "az", "abfs") and not parts.netloc:
        raise RemoteConfigError(f"remote URL {redact(url)} has no bucket/container name")
    if scheme in ("ssh", "sftp"):
        if not parts.hostname:
            raise RemoteConfigError(f"remote URL {redact(url)} has no host")
        try:
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            raise RemoteConfigError(f"remote URL {redact(url)} has an invalid port") from None
    return url


def check_options(options: dict[str, Any]) -> dict[str, Any]:
    """Refuse options that hold a credential at any depth (vrl.remote.credentials)."""
    for key, value in options.items():
        if is_secret_option(key):
            raise RemoteConfigError(f"option {key!r} looks like a credential; "
                                    + CREDENTIAL_HINT)
        where = find_secret(value, key)
        if where:
            raise RemoteConfigError(f"option {key!r} holds a credential (at {where}); "
                                    + CREDENTIAL_HINT)
    return options


def _import(scheme: str, module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package, extra = _EXTRAS[scheme]
        raise MissingBackendError(f"{scheme}:// remotes need {package}, which is not "
                                  f"installed: pip install 'vrl[{extra}]'") from exc


_BOTOCORE_LOADER: Any = None


def _s3_session(profile: str | None) -> Any:
    """A new aiobotocore session (credentials and profile resolved afresh, as before)
    sharing one loader of botocore's data files: reading those again for every remote
    opened was most of the time of a no-op push."""
    global _BOTOCORE_LOADER
    import aiobotocore.session
    import botocore.loaders

    if _BOTOCORE_LOADER is None:
        _BOTOCORE_LOADER = botocore.loaders.create_loader()
    session = aiobotocore.session.AioSession(profile=profile or None)
    session.register_component("data_loader", _BOTOCORE_LOADER)
    return session


def _bool(value: str | None) -> bool | None:
    return None if value is None else value.strip().lower() in ("1", "true", "yes", "on")


def open_remote(url: str, options: dict[str, str] | None = None) -> RemoteStore:
    """A RemoteStore for `url` with backend `options` (endpoint_url, profile, ...)."""
    options = dict(options or {})
    check_url(url)
    if "://" not in url:
        return LocalRemote(Path(url), url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        return LocalRemote(Path(unquote(parts.path)), url)
    if scheme == "memory":
        import fsspec

        fs = fsspec.filesystem("memory")
        return FsspecRemote(fs, f"/{parts.netloc}{parts.path}".rstrip("/") or "/", url,
                            "atomic within one process (in-memory, for tests)")
    if scheme == "s3":
        s3fs = _import(scheme, "s3fs")
        client_kwargs: dict[str, Any] = {}
        if options.get("region"):
            client_kwargs["region_name"] = options["region"]
        kwargs: dict[str, Any] = {
            "skip_instance_cache": True, "client_kwargs": client_kwargs,
            # bounded: a dead endpoint must fail in seconds, not hang
            "config_kwargs": {"connect_timeout": float(options.get("connect_timeout",
                                                                   CONNECT_TIMEOUT)),
                              "read_timeout": float(options.get("read_timeout", READ_TIMEOUT)),
                              "retries": {"max_attempts": int(options.get("retries", 3)),
                                          "mode": "standard"}},
        }
        if options.get("endpoint_url"):
            kwargs["endpoint_url"] = options["endpoint_url"]
        kwargs["session"] = _s3_session(options.get("profile"))
        if _bool(options.get("anon")):
            kwargs["anon"] = True
        fs = s3fs.S3FileSystem(**kwargs)
        fs.retries = int(options.get("retries", 3))  # s3fs's own retry loop, on top of boto's
        return S3Remote(fs, f"{parts.netloc}{parts.path}".rstrip("/"), url)
    if scheme in ("ssh", "sftp"):
        sshfs = _import(scheme, "sshfs")
        kwargs = {"skip_instance_cache": True,
                  "connect_timeout": float(options.get("connect_timeout", CONNECT_TIMEOUT))}
        if parts.port:
            kwargs["port"] = parts.port
        if parts.username:
            kwargs["username"] = unquote(parts.username)
        if options.get("known_hosts"):
            kh = options["known_hosts"]
            kwargs["known_hosts"] = None if kh.lower() == "none" else os.path.expanduser(kh)
        if options.get("identity_file") or options.get("client_keys"):
            kwargs["client_keys"] = [os.path.expanduser(options.get("identity_file")
                                                        or options["client_keys"])]
        try:
            with _connect_guard(url):
                fs = sshfs.SSHFileSystem(parts.hostname, **kwargs)
        except MissingBackendError:
            raise
        return FsspecRemote(fs, parts.path or "/", url,
                            "atomic (SFTP O_EXCL lock file + posix-rename)")
    if scheme in ("gs", "gcs"):
        return GcsRemote(_gcs_fs(scheme, options), f"{parts.netloc}{parts.path}".rstrip("/"),
                         url)
    return AzureRemote(_azure_fs(scheme, options), f"{parts.netloc}{parts.path}".rstrip("/"),
                       url)


def _gcs_fs(scheme: str, options: dict[str, str]) -> Any:
    """gcsfs's JSON-API file system. Not `gcsfs.GCSFileSystem`: by default (unless
    GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false) that is gcsfs's experimental subclass, which
    asks the gRPC Storage Control API for every bucket's layout, and, when the answer
    fails (any emulator, or no route to Google), asks again before every operation and
    renames through `moveTo`, which emulators refuse: minutes of retries per push."""
    _import(scheme, "gcsfs.core")
    import aiohttp

    kwargs: dict[str, Any] = {
        "skip_instance_cache": True,
        # bounded: a dead endpoint must fail in seconds, not hang
        "requests_timeout": aiohttp.ClientTimeout(
            sock_connect=float(options.get("connect_timeout", CONNECT_TIMEOUT)),
            sock_read=float(options.get("read_timeout", READ_TIMEOUT))),
    }
    if options.get("project"):
        kwargs["project"] = options["project"]
    if options.get("endpoint_url"):
        kwargs["endpoint_url"] = options["endpoint_url"].rstrip("/")
    if _bool(options.get("anon")):
        kwargs["token"] = "anon"  # no credential lookup at all (public buckets, emulators)
    return _gcs_class(max(1, int(options.get("retries", 3))))(**kwargs)


@functools.cache
def _gcs_class(retries: int) -> Any:
    """gcsfs fixes its retries (6, backing off up to ~30 s) when its class is made: a
    subclass with vrl's count, so a dead endpoint fails in seconds (3 attempts, as S3)."""
    from gcsfs.core import GCSFileSystem
    from gcsfs.retry import retry_request

    class Gcs(GCSFileSystem):
        _request = retry_request(retries=retries)(GCSFileSystem._request.__wrapped__)

    return Gcs


def _azure_fs(scheme: str, options: dict[str, str]) -> Any:
    """adlfs's file system. With `endpoint_url` (Azurite, a private endpoint), the blob
    endpoint is that URL and the key comes from AZURE_STORAGE_ACCOUNT_KEY (none: anonymous);
    otherwise adlfs finds the account and credentials itself (AZURE_STORAGE_* variables,
    else DefaultAzureCredential)."""
    adlfs = _import(scheme, "adlfs")
    kwargs: dict[str, Any] = {
        "skip_instance_cache": True,  # bounded: a dead endpoint must fail in seconds
        "connection_timeout": int(float(options.get("connect_timeout", CONNECT_TIMEOUT))),
        "read_timeout": int(float(options.get("read_timeout", READ_TIMEOUT))),
    }
    anon = _bool(options.get("anon"))
    name = options.get("account_name") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    endpoint = options.get("endpoint_url", "").rstrip("/")
    if endpoint:
        # adlfs builds https://{account_host} only: an http endpoint (Azurite) needs a
        # connection string, made here from the endpoint and the key in the environment
        name = name or urlsplit(endpoint).path.strip("/").split("/")[-1]
        key = None if anon else os.environ.get("AZURE_STORAGE_ACCOUNT_KEY")
        conn = f"BlobEndpoint={endpoint};"
        if key:
            conn += f"AccountName={name};AccountKey={key};"
        kwargs["connection_string"] = conn
    else:
        if name:
            kwargs["account_name"] = name
        if anon is not None:
            kwargs["anon"] = anon
    with _connect_guard("az://"):
        fs = adlfs.AzureBlobFileSystem(**kwargs)
    # the SDK retries 10 times, from 15 s apart (85 s for a dead endpoint), and adlfs
    # passes no retry settings: bound its policy to vrl's (3 attempts, 1 s, 2 s apart)
    policy = getattr(getattr(fs.service_client, "_config", None), "retry_policy", None)
    if policy is not None and hasattr(policy, "total_retries"):
        retries = max(0, int(options.get("retries", 3)) - 1)
        policy.total_retries = policy.connect_retries = retries
        policy.read_retries = policy.status_retries = retries
        policy.initial_backoff, policy.increment_base = 1, 2
    return fs


@contextlib.contextmanager
def _connect_guard(url: str) -> Iterator[None]:
    from vrl.remote.base import translate

    try:
        yield
    except Exception as exc:  # noqa: BLE001 - connection errors of any backend
        raise translate(exc, url, "connecting") from exc
