"""Reading YAML files: the block-YAML reader returns exactly what PyYAML's safe loader returns —
on the documents generated fleet and request files are made of, on a table of tricky ones, on
random documents and on random edits of them — or hands the text to PyYAML; and a bad file is
still one line naming what is wrong and where."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cohabit.cli.requestfile import load_request_file
from cohabit.hardware.fleetfile import dump_fleet
from cohabit.yamlfile import NOT_BLOCK_YAML, FileProblem, load_mapping, read_block_yaml
from tests.placement.fleets import cpu_host, fleet, gpu, node

# The loader load_mapping falls back to: libyaml's where the wheel has it (it and PyYAML's
# pure-Python loader differ on a few texts, such as a tab after a colon).
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def pyyaml(text: str) -> Any:
    return yaml.load(text, Loader=LOADER)


def same_as_pyyaml(text: str) -> Any:
    """The block reader's answer, checked against PyYAML's where it gives one (types too:
    1, 1.0 and True are equal in Python but not the same value)."""
    fast = read_block_yaml(text)
    if fast is not NOT_BLOCK_YAML:
        assert repr(fast) == repr(pyyaml(text)), text
    return fast


def test_a_generated_fleet_file_reads_as_pyyaml_reads_it() -> None:
    l4 = gpu(0, 24, product="NVIDIA L4", version=None)
    h100 = gpu(
        1,
        80,
        product="NVIDIA H100 80GB HBM3",
        version="12.10",
        mig=(("3g.40gb", 40), ("1g.10gb", 10)),
    )
    text = dump_fleet(fleet(node("node-a", l4, h100), cpu_host("cpu-box", 64)))
    assert same_as_pyyaml(text) is not NOT_BLOCK_YAML


def test_a_generated_request_file_reads_as_pyyaml_reads_it(tmp_path: Path) -> None:
    document = {
        "requests": [
            {"name": "a", "vram": "6GiB", "tensor_parallel": 2, "vendor": "nvidia"},
            {"name": "b", "vram": 1024, "min_accel_version": "12.4", "priority": -3},
            {"name": "on", "vram": "1.5GiB", "engine": "vllm", "min_copies": 0},
        ]
    }
    text = yaml.safe_dump(document, sort_keys=False)
    assert same_as_pyyaml(text) == document
    block, flow = tmp_path / "block.yaml", tmp_path / "flow.yaml"
    block.write_text(text)
    flow.write_text(yaml.safe_dump(document, default_flow_style=None, sort_keys=False))
    assert load_request_file(block) == load_request_file(flow)


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\nb: yes\nc: 'yes'\nd: ~\ne:\nf: -3\ng: 1.5\nh: 12.10\ni: '12.10'\nj: null\n",
        "on: off\nNo: N\nt: TRUE\nk: +7\nl: 0\nm: -0\nn: 1.5e+3\no: 7.\n",
        "nodes:\n- name: a\n  gpus:\n  - index: 0\n    memory: 8GiB\n- name: b\nafter: 1\n",
        "nodes:\n    -   name: a\n        gpus:\n            - 0\n            - 1\n",
        "a:\n  b:\n    c: d\n  e: f\ng: h\n",
        "- a\n- b: 1\n  c: 2\n- 3g.40gb\n",
        "# a comment\n\na: b   \n  # indented comment\nc: x y  z\n",
        "url: http://host:8080/x\nratio: a:b\nquote: it's\ntext: \"say 'hi'\"\n",
        "version: 12.4\nname: 12 GiB\nneg: -1abc\ndot: .x\nslash: /dev/x\ntilde: ~x\n",
        "name: café\n",
    ],
)
def test_block_yaml_reads_as_pyyaml(text: str) -> None:
    assert same_as_pyyaml(text) is not NOT_BLOCK_YAML


@pytest.mark.parametrize(
    "text",
    [
        "a: 012\n",  # octal in YAML 1.1
        "a: 0x1f\n",
        "a: 1_000\n",
        "a: 1:30\n",  # sexagesimal
        "a: .inf\n",
        "a: 2024-01-01\n",
        "a: [1, 2]\n",
        "a: {b: 1}\n",
        "a: &x 1\nb: *x\n",
        "a: !!str 1\n",
        "a: |\n  text\n",
        "a: >\n  text\n",
        "a: 1 # note\n",
        "a:\tb\n",
        "a: 1\r\nb: 2\r\n",
        "a: 1\na: 2\n",
        "- - a\n",
        "a: b\n  c\n",
        "a: 'it''s'\n",
        'a: "line\\n"\n',
        "---\na: 1\n",
        "",
        "a:\n    b: 1\n  c: 2\n",
        "a: 1\n- b\n",
        "-\n  a: 1\n",
        "? a\n: b\n",
        "'a': 1\n",
        "a: b: c\n",
        "\ufeffa: 1\n",
        "é: no\n",
        "on: 1\ntrue: 2\n",  # one key twice
    ],
)
def test_anything_else_is_left_to_pyyaml(tmp_path: Path, text: str) -> None:
    assert read_block_yaml(text) is NOT_BLOCK_YAML
    path = tmp_path / "file.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        expected: object = pyyaml(text)
    except yaml.YAMLError:
        expected = FileProblem
    if text in ("a: 1\na: 2\n", "on: 1\ntrue: 2\n"):
        expected = FileProblem  # load_mapping refuses a key given twice
    try:
        got: object = load_mapping(path, what="file")
    except FileProblem:
        got = FileProblem
    assert got == expected or (got is FileProblem and not isinstance(expected, dict)), got


def test_a_duplicate_key_in_block_yaml_names_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "requests.yaml"
    path.write_text("requests:\n- name: a\n  vram: 1GiB\n  vram: 2GiB\n")
    with pytest.raises(FileProblem) as raised:
        load_request_file(path)
    assert str(raised.value) == (
        f"{path}: not valid YAML (line 4): duplicate key 'vram' (first on line 3)"
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("requests:\n- name: a\n  vram: 1GiB\n- name: b\n  vram: 0\n", "requests[1] (b): 'vram'"),
        ("requests:\n- name: a\n  vram: 1GiB\n  colour: red\n", "requests[0] (a): unknown key"),
        ("requests:\n- name: a\n  vram: 1GiB\n- name: a\n  vram: 2GiB\n", "requests[1] (a): dup"),
        ("requests:\n- name: a\n  vram: 1GiB\n  vendor: nvidea\n", "requests[0] (a): 'vendor'"),
        ("requests:\n- name: a\n- vram: 1GiB\n", "requests[0] (a): missing 'vram'"),
        ("requests:\n- name: a\n  vram: 1GiB\n- just text\n", "requests[1]: expected a mapping"),
    ],
)
def test_bad_block_yaml_request_files_say_what_and_where(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "requests.yaml"
    path.write_text(text)
    with pytest.raises(FileProblem) as raised:
        load_request_file(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: {problem}")
    assert "\n" not in message


# Scalars with the characters that matter to YAML, and the words its resolvers turn into
# something else than a string.
SCALAR_TEXT = st.text(alphabet="ab1-0.:# '\"~+eyON_", max_size=8) | st.sampled_from(
    ["yes", "No", "on", "null", "~", "true", "012", "0x1", "1_0", ".inf", "2024-01-02", "12.10"]
)
SCALARS = (
    st.from_regex(r"[A-Za-z][A-Za-z0-9 ./-]{0,10}", fullmatch=True)
    | SCALAR_TEXT
    | st.integers()
    | st.booleans()
    | st.none()
    | st.floats(allow_nan=False, allow_infinity=False)
)
KEYS = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True)
DOCUMENTS = st.recursive(
    st.dictionaries(KEYS, SCALARS, max_size=4),
    lambda children: (
        st.lists(children | SCALARS, max_size=4)
        | st.dictionaries(KEYS, children | SCALARS, min_size=1, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(DOCUMENTS, st.sampled_from([2, 4]))
def test_documents_pyyaml_writes_read_back_as_pyyaml_reads_them(
    document: object, indent: int
) -> None:
    text = yaml.safe_dump(document, default_flow_style=False, sort_keys=False, indent=indent)
    same_as_pyyaml(text)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    DOCUMENTS,
    st.lists(
        st.tuples(st.integers(min_value=0), st.sampled_from([*"-: #'\"\n\tab0{[&!|>,?", ""])),
        min_size=1,
        max_size=3,
    ),
)
def test_an_edited_document_is_read_as_pyyaml_reads_it_or_left_to_pyyaml(
    document: object, edits: list[tuple[int, str]]
) -> None:
    """Characters put in or taken out anywhere: whatever the block reader accepts, PyYAML
    reads the same way (and never refuses)."""
    text = yaml.safe_dump(document, default_flow_style=False, sort_keys=False)
    for at, char in edits:
        at %= len(text) + 1
        text = text[:at] + char + text[at + (0 if char else 1) :]
    fast = read_block_yaml(text)
    if fast is not NOT_BLOCK_YAML:
        assert repr(fast) == repr(pyyaml(text)), text
