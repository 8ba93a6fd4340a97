"""The pure parts of MCP tools for agents: names, grants and argument limits."""

from __future__ import annotations

import pytest

from bullpen.agents.mcp import parse_grants, refusal, split_name, stdio_environment
from bullpen.errors import BullpenError


def test_wire_names_split_one_way_and_built_in_names_are_not_mcp_names() -> None:
    assert split_name("files__read_file") == ("files", "read_file")
    assert split_name("files__a__b") == ("files", "a__b")
    for name in ("delegate", "finish", "Files__x", "files__", "__x", "a_b__c"):
        assert split_name(name) is None, name
    assert refusal("finish") is None
    assert (
        refusal("files__rm") == "error: 'rm' of MCP server 'files' is not a tool this agent may use"
    )


def test_grants_merge_repeats_and_carry_limits() -> None:
    grants = parse_grants(
        [
            {"server": "files", "tools": ["read", {"name": "search", "max_chars": 20}]},
            {
                "server": "files",
                "tools": [{"name": "read", "arguments": {"path": {"max_length": 5}}}],
            },
        ]
    )
    assert len(grants) == 1 and grants[0].tools == frozenset({"read", "search"})
    search, read = grants[0].limits["search"], grants[0].limits["read"]
    assert search.refusal('{"q": "a long query here"}', {"q": "a long query here"}) == (
        "the arguments are longer than 20 characters"
    )
    assert read.refusal('{"path": "/etc/passwd"}', {"path": "/etc/passwd"}) == (
        "'path' is longer than 5 characters"
    )
    assert read.refusal('{"path": "/tmp"}', {"path": "/tmp"}) is None
    assert parse_grants(None) == ()
    for bad in ("files", [{"server": "Files", "tools": ["x"]}], [{"server": "f", "tools": []}]):
        with pytest.raises(BullpenError):
            parse_grants(bad)


def test_argument_limits_check_numbers_and_choices() -> None:
    (grant,) = parse_grants(
        [
            {
                "server": "s",
                "tools": [
                    {
                        "name": "t",
                        "arguments": {
                            "n": {"minimum": 1, "maximum": 10},
                            "mode": {"enum": ["fast", "safe"]},
                        },
                    }
                ],
            }
        ]
    )
    limits = grant.limits["t"]
    assert limits.refusal("{}", {"n": 11}) == "'n' must be at most 10"
    assert limits.refusal("{}", {"n": 0}) == "'n' must be at least 1"
    assert limits.refusal("{}", {"n": True}) == "'n' must be a number"
    assert limits.refusal("{}", {"mode": "rm"}) == '\'mode\' must be one of ["fast","safe"]'
    assert limits.refusal("{}", {"n": 5, "mode": "safe", "other": 1}) is None


def test_a_stdio_server_gets_a_clean_environment_whatever_its_env_says() -> None:
    env = stdio_environment({"LANG": "de_DE.UTF-8", "HOME": "/root", "TZ": "UTC"}, "/tmp/x")
    assert env == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "de_DE.UTF-8",
        "HOME": "/tmp/x",
        "TZ": "UTC",
    }
