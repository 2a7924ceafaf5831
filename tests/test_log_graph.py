"""`vrl log --graph` and `--all` (issue 28): git's text graph, exact strings - first the
pure layout (vrl/graph_text.py), then the command on forked, merged (two and three
parents), shallow and multi-root histories."""

import json

import pytest
from helpers import vrl
from test_views import at, state

from vrl import Repo
from vrl.graph_text import draw, layout, topo_order
from vrl.objects import Commit


def drawn(commits, **kw):
    """The graph with each commit's id as its one line of text."""
    return draw(commits, [[c] for c, _ in commits], **kw)


# ------------------------------------------------------------------ the layout, pure

def test_linear_history_is_one_column():
    assert drawn([("c", ["b"]), ("b", ["a"]), ("a", [])]) == ["* c", "* b", "* a"]


def test_a_fork_gets_a_second_column_that_joins_its_parent():
    assert drawn([("d", ["b"]), ("c", ["b"]), ("b", ["a"]), ("a", [])]) == [
        "* d",
        "| * c",
        "|/",
        "* b",
        "* a"]


def test_a_merge_of_two_fans_out_and_the_lines_meet_at_the_base():
    assert drawn([("M", ["B", "C"]), ("C", ["A"]), ("B", ["A"]), ("A", [])]) == [
        "*   M",
        "|\\",
        "| * C",
        "* | B",
        "|/",
        "* A"]


def test_a_merge_whose_parent_a_column_already_waits_for_joins_it():
    """Merging the trunk into a run: the trunk's column is left of the merge (git's
    left-skewed `|/|`), or right beside it (`|\\|`)."""
    assert drawn([("M2", ["m1"]), ("X", ["e1", "m1"]), ("e1", ["base"]), ("m1", ["base"]),
                  ("base", [])]) == [
        "* M2",
        "| * X",
        "|/|",
        "| * e1",
        "* | m1",
        "|/",
        "* base"]
    assert drawn([("X", ["e1", "m1"]), ("m2", ["m1"]), ("e1", ["base"]), ("m1", ["base"]),
                  ("base", [])]) == [
        "*   X", "|\\", "| | * m2", "| |/", "* | e1", "| * m1", "|/", "* base"]
    # the trunk's column is right beside the merge: joined there
    assert drawn([("Y", ["X", "m2"]), ("m2", ["m1"]), ("X", ["e1", "m1"]), ("e1", ["m1"]),
                  ("m1", [])]) == [
        "*   Y", "|\\", "| * m2", "* | X", "|\\|", "* | e1", "|/", "* m1"]


def test_an_octopus_merge_of_three():
    assert drawn([("M", ["B", "C", "D"]), ("D", ["A"]), ("C", ["A"]), ("B", ["A"]),
                  ("A", [])]) == [
        "*-.   M",
        "|\\ \\",
        "| | * D",
        "| * | C",
        "| |/",
        "* | B",
        "|/",
        "* A"]


def test_an_octopus_beside_another_line_makes_room_for_it():
    assert drawn([("top", ["M", "x"]), ("x", ["base"]), ("M", ["B", "C", "D"]),
                  ("D", ["A"]), ("C", ["A"]), ("B", ["A"]), ("A", ["base"]),
                  ("base", [])]) == [
        "*   top",
        "|\\",
        "| * x",
        "|  \\",
        "*-. \\   M",
        "|\\ \\ \\",
        "| | * | D",
        "| * | | C",
        "| |/ /",
        "* | | B",
        "|/ /",
        "* | A",
        "|/",
        "* base"]


def test_a_parent_outside_the_shown_commits_ends_its_line():
    """A shallow or partial history: z's parent w is not there, so its column ends at z;
    a line that starts right under it is set off by a gap row (else the two read as one)."""
    assert drawn([("x", ["y"]), ("z", ["w"]), ("y", [])]) == ["* x", "| * z", "* y"]
    assert drawn([("a", ["c"]), ("z", ["w"]), ("b", ["c"]), ("c", [])]) == [
        "* a",
        "| * z",
        "|",
        "| * b",
        "|/",
        "* c"]
    # an ended line with others to its right: they move in
    assert drawn([("z", ["w"]), ("b", ["c"]), ("y", ["c"]), ("c", [])]) == [
        "* z", "", "* b", "| * y", "|/", "* c"]


def test_history_past_what_is_shown_keeps_its_lines_open():
    """-n: a parent that exists below the last commit shown keeps its column."""
    rows = [("d", ["b"]), ("c", ["b"])]
    assert drawn(rows) == ["* d", "", "* c"]
    assert drawn(rows, more_below={"b"}) == ["* d", "| * c", "|/"]


def test_many_parallel_branches_interleaved_in_time():
    assert drawn([("a2", ["a1"]), ("b2", ["b1"]), ("c2", ["c1"]), ("a1", ["base"]),
                  ("b1", ["base"]), ("c1", ["base"]), ("base", [])]) == [
        "* a2",
        "| * b2",
        "| | * c2",
        "* | | a1",
        "| * | b1",
        "|/ /",
        "| * c1",
        "|/",
        "* base"]
    # four tips on one base, one after the other
    assert drawn([(t, ["base"]) for t in "wxyz"] + [("base", [])]) == [
        "* w", "| * x", "|/", "| * y", "|/", "| * z", "|/", "* base"]


def test_two_roots_and_a_parent_two_columns_away():
    assert drawn([("b2", ["b1"]), ("a2", ["a1"]), ("b1", []), ("a1", [])]) == [
        "* b2", "| * a2", "* | b1", " /", "* a1"]
    # r's parent is two columns to its left: its edge passes under q's line
    assert drawn([("p", ["base"]), ("q", ["x"]), ("r", ["base"]), ("x", []),
                  ("base", [])]) == [
        "* p", "| * q", "| | * r", "|_|/", "| * x", "* base"]


def test_detail_lines_run_beside_the_graph():
    """Without --oneline: a merge's fan-out and a collapse take the rows of the commit's
    next lines, then the columns continue beside the rest."""
    rows = [("M", ["B", "C"]), ("C", ["A"]), ("B", ["A"]), ("A", [])]
    texts = [[f"commit {c}", "Author: t", ""] for c, _ in rows]
    assert draw(rows, texts) == [
        "*   commit M", "|\\  Author: t", "| |",
        "| * commit C", "| | Author: t", "| |",
        "* | commit B", "|/  Author: t", "|",
        "* commit A", "  Author: t", ""]
    # lines left over when the text is shorter get rows of their own
    assert draw(rows, [["M"], ["C"], ["B"], ["A"]]) == drawn(rows)
    rows_ = layout(rows)
    assert rows_[0].commit == "*   " and rows_[0].after == ("|\\",)
    assert rows_[0].padding == "| | "


def test_topological_order_is_newest_first_among_the_ready():
    parents = {"M": ["m2", "e2"], "m2": ["m1"], "e2": ["e1"], "m1": ["base"],
               "e1": ["base"], "base": []}
    time = {"M": "5", "e2": "4", "m2": "3", "e1": "2", "m1": "1", "base": "0"}
    order = topo_order(["M"], parents.__getitem__, time.__getitem__)
    assert order == ["M", "e2", "m2", "e1", "m1", "base"]
    # a child stamped before its parent (clock skew) still comes first
    time["e2"] = "0"
    assert topo_order(["M"], parents.__getitem__, time.__getitem__) == [
        "M", "m2", "m1", "e2", "e1", "base"]
    # several heads, each commit once; equal times keep the order the heads were given
    assert topo_order(["e1", "m1", "e1"], parents.__getitem__, lambda _: "t") == [
        "e1", "m1", "base"]


# ------------------------------------------------------------------ the command

def _merge(repo, parents, minute, message, ref="refs/heads/main"):
    """A commit with several parents, written as `vrl merge` will write one (its snapshot:
    the first parent's), and `ref` moved to it."""
    first = repo.read_commit(parents[0])
    cid = repo.objects.write("commit", Commit(
        manifest=first.manifest, parents=tuple(parents), message=message, author="tester",
        time=at(minute), step=minute).to_bytes())
    repo.refs.update(ref, cid, reason="merge")
    return cid


@pytest.fixture
def forked(ws):
    """base -> m1 -> m2 on main; exp forks from base: e1 -> e2; main merges exp (M); tag
    best at e1; origin/main (remote-tracking) at m1."""
    repo = Repo.init(ws)

    def commit(name, minute, ref="HEAD"):
        return repo.commit(state(minute), env=False, step=minute, time=at(minute),
                           message=name, ref=ref, author="tester")

    ids = {"base": commit("base", 0), "m1": commit("m1", 1)}
    repo.branch("exp", ids["base"])
    ids["e1"] = commit("e1", 2, "refs/heads/exp")
    ids["m2"] = commit("m2", 3)
    ids["e2"] = commit("e2", 4, "refs/heads/exp")
    ids["M"] = _merge(repo, [ids["m2"], ids["e2"]], 5, "merge exp")
    repo.tag("best", ids["e1"])
    repo.refs.update("refs/remotes/origin/main", ids["m1"])
    return repo, {k: v[:12] for k, v in ids.items()}, ids


FORK_NOTE = "[forked from main at step 0 ({base})]"


def test_log_graph_oneline_all_draws_the_fork_and_the_merge(forked, capsys):
    _, s, _ = forked
    code, out, err = vrl(capsys, "log", "--graph", "--oneline", "--all")
    assert code == 0, err
    assert out.splitlines() == [
        f"*   {s['M']} (HEAD -> main) merge exp",
        "|\\",
        f"| * {s['e2']} (exp) e2",
        f"* | {s['m2']} m2",
        f"| * {s['e1']} (tag: best) e1 " + FORK_NOTE.format(**s),
        f"* | {s['m1']} (origin/main) m1",
        "|/",
        f"* {s['base']} base"]
    # from HEAD (the merge) the drawing is the same; from exp, one line
    code, out2, _ = vrl(capsys, "log", "--graph", "--oneline")
    assert out2 == out
    code, out, _ = vrl(capsys, "log", "--graph", "--oneline", "exp")
    assert out.splitlines() == [f"* {s['e2']} (exp) e2",
                                f"* {s['e1']} (tag: best) e1 " + FORK_NOTE.format(**s),
                                f"* {s['base']} base"]


def test_a_pattern_rev_is_the_branches_it_matches(forked, capsys):
    repo, s, ids = forked
    repo.branch("sw/a", ids["m1"])
    repo.branch("sw/b", ids["e1"])
    code, out, err = vrl(capsys, "log", "--oneline", "sw/*")
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()] == \
        [s["e1"], s["m1"], s["base"]]  # both lines, each commit once, newest first
    code, out2, _ = vrl(capsys, "log", "--oneline", "sw/a", "sw/b")
    assert out2 == out
    code, out, err = vrl(capsys, "log", "--oneline", "origin/*")  # remote-tracking too
    assert code == 0 and out.split()[0] == s["m1"], err
    code, out, err = vrl(capsys, "log", "nope/*")
    assert code == 1 and out == "" and err == "error: no branch matches 'nope/*'\n", err


def test_log_graph_runs_the_columns_beside_each_commits_lines(forked, capsys):
    _, s, ids = forked
    code, out, _ = vrl(capsys, "log", "--graph", "-n", "2")
    assert code == 0 and out.splitlines() == [
        f"*   commit {ids['M']} (HEAD -> main)",
        f"|\\  Merge: {s['m2']} {s['e2']}",
        "| | Author: tester",
        f"| | Date:   {at(5)}",
        "| | Step:   5",
        "| |",
        "| |     merge exp",
        "| |",
        f"| * commit {ids['e2']} (exp)",
        "| | Author: tester",
        f"| | Date:   {at(4)}",
        "| | Step:   4",
        "| |",
        "| |     e2",
        "| |"]
    code, out, _ = vrl(capsys, "log", "--graph", "origin/main")
    assert out.splitlines()[:3] == [f"* commit {ids['m1']} (origin/main)",
                                    "| Author: tester", f"| Date:   {at(1)}"]
    assert out.splitlines()[-7:] == [f"* commit {ids['base']}", "  Author: tester",
                                     f"  Date:   {at(0)}", "  Step:   0", "",
                                     "      base", ""]


def test_log_all_lists_every_commit_once_newest_first(forked, capsys):
    repo, s, ids = forked
    repo.checkout(ids["m1"])  # a detached HEAD is a starting point too
    repo.refs.update("refs/heads/main", ids["m2"])
    code, out, _ = vrl(capsys, "log", "--all", "--oneline")
    assert out.splitlines() == [
        f"{s['e2']} (exp) e2", f"{s['m2']} (main) m2",
        f"{s['e1']} (tag: best) e1 " + FORK_NOTE.format(**s),
        f"{s['m1']} (HEAD, origin/main) m1", f"{s['base']} base"]
    code, out, _ = vrl(capsys, "log", "--all", "--oneline", "-n", "2")
    assert out.splitlines() == [f"{s['e2']} (exp) e2", f"{s['m2']} (main) m2"]
    code, out, _ = vrl(capsys, "log", "--all", "--json")
    assert [d["message"] for d in json.loads(out)] == ["e2", "m2", "e1", "m1", "base"]
    assert json.loads(out)[0]["summary"] is not None  # the full commits, as `log --json`
    # several revisions: each commit once
    code, out, _ = vrl(capsys, "log", "--oneline", "exp", "main")
    assert [line.split()[0] for line in out.splitlines()] == [
        s["e2"], s["m2"], s["e1"], s["m1"], s["base"]]
    code, out, _ = vrl(capsys, "log", "--graph", "--oneline", "--all", "-n", "3")
    assert out.splitlines() == [f"* {s['e2']} (exp) e2",
                                f"| * {s['m2']} (main) m2",
                                f"* | {s['e1']} (tag: best) e1 " + FORK_NOTE.format(**s)]


def test_log_graph_draws_an_octopus_merge(forked, capsys):
    repo, s, ids = forked
    repo.branch("side", ids["base"])
    side = repo.commit(state(30), env=False, step=6, time=at(6), message="side",
                       ref="refs/heads/side", author="tester")
    octo = _merge(repo, [ids["m2"], ids["e2"], side], 7, "octopus")
    code, out, _ = vrl(capsys, "log", "--graph", "--oneline")
    assert out.splitlines() == [
        f"*-.   {octo[:12]} (HEAD -> main) octopus",
        "|\\ \\",
        f"| | * {side[:12]} (side) side [forked from main at step 0 ({s['base']})]",
        f"| * | {s['e2']} (exp) e2",
        f"* | | {s['m2']} m2",
        f"| * | {s['e1']} (tag: best) e1 " + FORK_NOTE.format(**s),
        "| |/",
        f"* | {s['m1']} (origin/main) m1",
        "|/",
        f"* {s['base']} base"]
    code, out, _ = vrl(capsys, "log", "-n", "1")
    assert f"Merge: {s['m2']} {s['e2']} {side[:12]}\n" in out


def test_log_graph_ends_a_line_at_a_parent_this_repository_lacks(forked, capsys):
    """A shallow or partial history: the parent's object is not here."""
    repo, s, ids = forked
    first = repo.read_commit(ids["m1"])
    lone = repo.objects.write("commit", Commit(
        manifest=first.manifest, parents=("ab" * 32,), message="from afar", author="t",
        time=at(9)).to_bytes())
    repo.refs.update("refs/heads/afar", lone)
    code, out, err = vrl(capsys, "log", "--graph", "--oneline", "--all")
    assert code == 0, err
    assert out.splitlines()[:3] == [f"* {lone[:12]} (afar) from afar", "",
                                    f"*   {s['M']} (HEAD -> main) merge exp"]


def test_log_graph_refuses_json_and_metrics(forked, capsys):
    for extra in ("--json", "--metrics=return"):
        code, _, err = vrl(capsys, "log", "--graph", extra)
        assert code == 2 and "--graph draws the text log" in err


def test_log_graph_and_all_stay_light(tmp_path):
    """No torch, PyYAML or thread pools for the drawing either."""
    from test_torch_free import HEAVY, modules_loaded, policy, save_file

    ws = tmp_path / "ws"
    ws.mkdir()
    save_file(policy(1), str(ws / "policy.safetensors"))
    modules_loaded(ws, "init")
    modules_loaded(ws, "commit", "-m", "v1")
    for args in (["log", "--graph", "--all"], ["log", "--graph", "--oneline", "--all"]):
        loaded = modules_loaded(ws, *args)
        assert not loaded & {"torch", *HEAVY}, (args, loaded & {"torch", *HEAVY})
