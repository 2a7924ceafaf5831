"""vrl.yaml12: YAML 1.2 scalars, and the values it resolves without PyYAML's parser."""

import math

import yaml
from hypothesis import given
from hypothesis import strategies as st

from vrl import yaml12

NUMBER_LIKE = st.from_regex(
    r"\A(?:[-+]?[0-9_]{0,4}(?:\.[0-9]{0,3})?(?:[eE][-+]?[0-9]{1,3})?|0[ox][0-9a-fA-F]{1,4}"
    r"|[-+]?\.(?:inf|Inf|INF|nan)|true|False|NULL|null|~|yes|off|[-+ .:#0-9eE]{1,6})\s?\Z")


def parsed(text):
    """What the YAML parser makes of a command-line value (the string itself if nothing)."""
    try:
        return yaml12.load(text)
    except (yaml.YAMLError, ValueError):
        return text


def same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


EXAMPLES = ["3", "-0x1", "0o17", "1e5", "1.", ".5", "-.inf", ".NaN", "true\n", "3 # n", " 7",
            "1_000", "0777", "1:30", "yes", "~", "+5", "-", "."]


@given(st.one_of(NUMBER_LIKE, st.text(max_size=8), st.sampled_from(EXAMPLES)))
def test_a_value_resolved_without_the_parser_is_what_the_parser_gives(text):
    assert same(yaml12.parse_scalar(text), parsed(text) if text else "")


def test_yaml_1_2_typing():
    assert yaml12.load("a: 3e-4\nb: off\nc: 0777\nd: 1:30\ne: 0o17\nf: -.inf\ng: [1, 2.0]\n"
                       "h: '3'\n") == {"a": 3e-4, "b": "off", "c": 777, "d": "1:30", "e": 15,
                                     "f": -math.inf, "g": [1, 2.0], "h": "3"}
    assert yaml12.parse_scalar("3e-4") == 3e-4 and yaml12.parse_scalar("True") is True
    assert yaml12.parse_scalar("[1, x]") == [1, "x"] and yaml12.parse_scalar("a: [") == "a: ["
