"""The one tool call assembler (`bullpen.gateway.chunks`), on the shapes providers send."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bullpen.gateway.chunks import AssembledCall, ToolCalls


def chunk(*pieces: Any, finish: str | None = None) -> dict[str, Any]:
    """A streamed chunk whose first choice carries these tool call pieces."""
    delta = {"tool_calls": list(pieces)}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def piece(
    index: int | None = 0,
    *,
    id: str | None = None,
    name: str | None = None,
    arguments: str | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {} if index is None else {"index": index}
    if id is not None:
        out["id"] = id
        out["type"] = "function"
    function = {k: v for k, v in (("name", name), ("arguments", arguments)) if v is not None}
    if function:
        out["function"] = function
    return out


def assemble(*chunks: dict[str, Any]) -> list[AssembledCall]:
    calls = ToolCalls()
    for c in chunks:
        calls.add(c)
    return calls.calls()


def test_openai_shape_name_and_id_first_then_argument_pieces() -> None:
    calls = assemble(
        chunk(piece(0, id="call_a", name="lookup", arguments="")),
        chunk(piece(0, arguments='{"ci')),
        chunk(piece(0, arguments='ty": "Oslo"}')),
        chunk(finish="tool_calls"),
    )
    assert calls == [AssembledCall(0, "call_a", "lookup", '{"city": "Oslo"}')]


def test_interleaved_indexes_are_kept_apart_and_ordered_by_index() -> None:
    texts = {0: '{"a": [1, 2, 3]}', 1: '{"b": "xyz"}', 2: "{}"}
    chunks = [chunk(piece(2, id="c2", name="third", arguments=""))]
    chunks += [chunk(piece(1, id="c1", name="second")), chunk(piece(0, id="c0", name="first"))]
    for k in range(max(len(t) for t in texts.values())):
        for i in (1, 0, 2):  # out of order on purpose
            if k < len(texts[i]):
                chunks.append(chunk(piece(i, arguments=texts[i][k])))
    calls = assemble(*chunks)
    assert [(c.index, c.id, c.name) for c in calls] == [
        (0, "c0", "first"),
        (1, "c1", "second"),
        (2, "c2", "third"),
    ]
    assert {c.index: c.arguments for c in calls} == texts


def test_several_pieces_of_one_call_in_one_chunk_join_in_order() -> None:
    # vLLM (speculative decoding) sends this: two entries with the same index in one chunk.
    calls = assemble(
        chunk(piece(0, id="x", name="f", arguments='{"k"'), piece(0, arguments=": 1")),
        chunk(piece(0, arguments="}")),
    )
    assert calls == [AssembledCall(0, "x", "f", '{"k": 1}')]


def test_the_name_comes_once_and_is_not_lost_to_later_pieces() -> None:
    calls = assemble(
        chunk(piece(0, id="x", name="read_file")),
        chunk(piece(0, name="", arguments="{")),
        chunk(piece(0, name=None, arguments="}")),
    )
    assert calls[0].name == "read_file" and calls[0].arguments == "{}"


def test_a_name_resent_with_every_piece_is_not_concatenated() -> None:
    # MiniMax via NVIDIA NIM resends the whole name with every piece.
    calls = assemble(*(chunk(piece(0, name="read_file", arguments=a)) for a in ("{", '"p":1', "}")))
    assert calls == [AssembledCall(0, None, "read_file", '{"p":1}')]


@pytest.mark.parametrize("cut", range(1, 30))
def test_arguments_cut_anywhere_mid_json_and_mid_character(cut: int) -> None:
    # Multi-byte and multi-code-point text: a cut may fall inside what renders as one glyph.
    text = json.dumps({"city": "Zürich 😀 e\u0301 👩\u200d💻", "n": [1.5]}, ensure_ascii=False)
    pieces = [text[j : j + cut] for j in range(0, len(text), cut)]
    calls = assemble(
        chunk(piece(0, id="x", name="f")), *(chunk(piece(0, arguments=p)) for p in pieces)
    )
    assert calls[0].arguments == text
    assert json.loads(calls[0].arguments)["city"] == "Zürich 😀 e\u0301 👩\u200d💻"


def test_arguments_cut_mid_escape_sequence() -> None:
    # As sent on the wire: the JSON text of the arguments is itself JSON-escaped in the chunk.
    text = json.dumps({"q": 'say "hi"\n'})
    raw = [json.dumps(text[:7]), json.dumps(text[7:9]), json.dumps(text[9:])]
    pieces = [json.loads(r) for r in raw]
    calls = assemble(*(chunk(piece(0, arguments=p)) for p in pieces))
    assert json.loads(calls[0].arguments) == {"q": 'say "hi"\n'}


def test_a_missing_index_counts_as_zero() -> None:
    calls = assemble(
        chunk(piece(None, id="x", name="f", arguments='{"a"')),
        chunk(piece(0, arguments=": 1}")),
    )
    assert calls == [AssembledCall(0, "x", "f", '{"a": 1}')]


@pytest.mark.parametrize("index", [None, "1", 1.0, True, [0]])
def test_an_index_that_is_not_an_integer_counts_as_zero(index: Any) -> None:
    calls = assemble(
        {"choices": [{"delta": {"tool_calls": [{"index": index, "function": {"name": "f"}}]}}]},
        chunk(piece(1, name="g")),
    )
    assert [(c.index, c.name) for c in calls] == [(0, "f"), (1, "g")]


def test_an_id_arriving_late_is_taken_and_a_resent_one_changes_nothing() -> None:
    calls = assemble(
        chunk(piece(0, name="f", arguments="{")),
        chunk(piece(0, id="call_late", arguments="}")),
        chunk(piece(0, id="call_late")),
        chunk(piece(0, id="")),  # an empty id does not wipe the one we have
    )
    assert calls == [AssembledCall(0, "call_late", "f", "{}")]


def test_a_call_without_an_id_has_none() -> None:
    assert assemble(chunk(piece(3, name="f", arguments="{}"))) == [
        AssembledCall(3, None, "f", "{}")
    ]


def test_junk_is_ignored_not_raised() -> None:
    calls = ToolCalls()
    for junk in (
        {},
        {"choices": []},
        {"choices": None},
        {"choices": ["x"]},
        {"choices": [{"delta": None}]},
        {"choices": [{"delta": {"tool_calls": None}}]},
        {"choices": [{"delta": {"tool_calls": {"index": 0}}}]},
        {"choices": [], "usage": {"prompt_tokens": 3}},
        chunk("not a piece", None, 7),
        chunk({"index": 0, "function": "not a dict"}),
        chunk({"index": 0, "id": 12, "function": {"name": 5, "arguments": {"a": 1}}}),
    ):
        calls.add(junk)
    # Only the last two made an entry (a piece with an index), with nothing usable in them.
    assert calls.calls() == [AssembledCall(0, None, "", "")]


def test_only_the_first_choice_is_read() -> None:
    both = {
        "choices": [
            {"index": 0, "delta": {"tool_calls": [piece(0, name="mine", arguments="{}")]}},
            {"index": 1, "delta": {"tool_calls": [piece(0, name="other", arguments="[]")]}},
        ]
    }
    assert assemble(both) == [AssembledCall(0, None, "mine", "{}")]


def test_empty_until_a_piece_arrives() -> None:
    calls = ToolCalls()
    assert not calls and calls.calls() == []
    calls.add({"choices": [{"index": 0, "delta": {"content": "just text"}}]})
    assert not calls
    calls.add_delta({"tool_calls": [piece(0, name="f")]})
    assert calls and calls.calls() == [AssembledCall(0, None, "f", "")]
