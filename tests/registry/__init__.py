import pytest

# The shared suite is not a test module, so ask pytest to rewrite its asserts too.
pytest.register_assert_rewrite(f"{__name__}.conformance")
