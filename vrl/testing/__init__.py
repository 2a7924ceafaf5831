"""Test support shipped with vrl: the remote conformance suite and throwaway local servers.

Nothing here is imported by vrl itself.
"""
