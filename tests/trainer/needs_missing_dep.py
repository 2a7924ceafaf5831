"""An env module whose dependency is not installed (for the error message test)."""

import vrl_test_no_such_dependency  # noqa: F401
