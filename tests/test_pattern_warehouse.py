"""The pattern warehouse: shipped entries, file:line validation, sources, when routing, CLI."""

from __future__ import annotations

import json
import os

import pytest
import tvm
from plus_tvm import cli
from plus_tvm.errors import PlusError
from plus_tvm.pattern_warehouse import (
    ENV_VAR,
    Constraints,
    Implementation,
    UnknownEntryError,
    Warehouse,
    WarehouseError,
    check_when,
    load_warehouse,
    package_dir,
)

# entries other tests rely on, with their priorities (a new entry needs no line here)
SHIPPED = {
    "attention": 300,
    "gemm_layernorm": 200,
    "conv2d_nhwc_pointwise": 101,
    "conv2d_depthwise": 100,
    "conv2d_epilogue": 100,
    "conv2d_grouped_padded": 100,
    "conv2d_nhwc_padded": 100,
    "conv2d_pixel": 100,
    "conv2d_pointwise": 100,
    "conv2d_strided": 100,
    "conv2d_strided_pointwise": 100,
    "gemm_epilogue": 100,
    "batch_gemm": 90,
    "conv2d_nested": 80,
    "layer_norm": 50,
    "rms_norm": 40,
    "softmax": 30,
}
# every entry file shipped in the package
N_SHIPPED = sum(f.endswith(".toml") for f in os.listdir(package_dir()))

GOOD = '''\
name = "{name}"
allow_epilogue = true
priority = 5
graph = """
loop0 [M, para]
  loop1 [N, para]
    loop2 [K, non-para, (dot)]
"""

[[implementation]]
name = "torch.linear"
target = "llvm"
when = "M >= 16"
'''


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


def write(folder, name: str, text: str) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def error_of(folder, **kw) -> WarehouseError:
    with pytest.raises(WarehouseError) as info:
        load_warehouse([str(folder)], **kw)
    return info.value


# ----------------------------------------------------------------------------- shipped entries
def test_shipped_warehouse_loads_sorted_by_priority_then_name():
    wh = load_warehouse(known_implementations=None)
    files = sorted(f[: -len(".toml")] for f in os.listdir(package_dir()) if f.endswith(".toml"))
    assert sorted(e.name for e in wh) == files and len(wh) == len(files)
    assert [e.name for e in wh] == sorted(files, key=lambda n: (-wh.get(n).priority, n))
    assert {name: wh.get(name).priority for name in SHIPPED} == SHIPPED
    assert wh.dirs == (package_dir(),)
    for e in wh:
        assert os.path.basename(e.path) == f"{e.name}.toml"
        assert e.implementations and e.graph.size_names()


def test_shipped_entries_have_the_paper_fields():
    wh = load_warehouse()
    att = wh.get("attention")
    assert att.allow_prologue and att.allow_epilogue
    assert [(i.name, i.target, i.when) for i in att.implementations] == [
        ("torch.sdpa_flash", "cuda", "M >= 512"),
        ("torch.sdpa", "any", None),
    ]
    assert att.graph.to_text().splitlines()[2] == "    loop2 [N, non-para, (reduceMax)]"
    ln, sm = wh.get("layer_norm"), wh.get("softmax")
    assert (ln.allow_prologue, ln.allow_epilogue) == (False, True)
    assert (sm.allow_prologue, sm.allow_epilogue) == (True, False)
    assert wh.get("conv2d_epilogue").constraints.layout == "NCHW"
    assert wh.get("gemm_epilogue").constraints.dtypes == ("float32", "float16", "bfloat16")
    assert wh.get("gemm_layernorm").implementations[0].name == "torch.linear_layernorm"


def test_rms_norm_entry_is_at_most_20_lines():
    with open(os.path.join(package_dir(), "rms_norm.toml")) as f:
        assert len(f.read().splitlines()) <= 20


def test_get_names_close_matches_and_digest_is_stable(tmp_path):
    wh = load_warehouse()
    with pytest.raises(UnknownEntryError, match="did you mean attention") as info:
        wh.get("atention")
    assert isinstance(info.value, PlusError) and isinstance(info.value, KeyError)
    assert "attention" in wh and "nope" not in wh
    assert wh.digest() == load_warehouse().digest()
    write(tmp_path, "extra", GOOD.format(name="extra"))
    assert load_warehouse([str(tmp_path)]).digest() != wh.digest()


# ----------------------------------------------------------------------------- sources
def test_user_folders_from_options_and_env_are_loaded(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    write(a, "mine_a", GOOD.format(name="mine_a"))
    write(b, "mine_b", GOOD.format(name="mine_b"))
    (a / "notes.txt").write_text("not an entry")
    (a / "evil.py").write_text("raise SystemExit('executed')")
    monkeypatch.setenv(ENV_VAR, f"{b}{os.pathsep}")
    wh = load_warehouse([str(a)])
    assert len(wh) == N_SHIPPED + 2 and wh.dirs == (package_dir(), str(b), str(a))
    assert wh.get("mine_a").path == str(a / "mine_a.toml")
    assert "mine_b" not in load_warehouse([str(a)], use_env=False)
    # the same folder named twice (env and options) is read once
    assert len(load_warehouse([str(b)])) == N_SHIPPED + 1


def test_missing_folder_is_named(tmp_path, monkeypatch):
    err = error_of(tmp_path / "nope")
    assert str(err).startswith(f"{tmp_path / 'nope'}: ") and "does not exist" in str(err)
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "gone"))
    with pytest.raises(WarehouseError, match=f"gone.*{ENV_VAR}"):
        load_warehouse()


def test_duplicate_names_across_two_folders_name_both_files(tmp_path):
    first = write(tmp_path / "a", "dup", GOOD.format(name="dup"))
    second = write(tmp_path / "b", "dup", GOOD.format(name="dup"))
    with pytest.raises(WarehouseError) as info:
        load_warehouse([str(tmp_path / "a"), str(tmp_path / "b")])
    assert str(info.value).startswith(f"{second}:1: ") and first in str(info.value)
    # a user entry cannot shadow a shipped one either
    write(tmp_path / "c", "softmax", GOOD.format(name="softmax"))
    err = error_of(tmp_path / "c")
    assert "softmax.toml" in str(err) and package_dir() in str(err)


# ----------------------------------------------------------------------------- bad entries
def bad(old: str = "", new: str = "", extra: str = "") -> str:
    """GOOD as entry ``bad`` with one edit; GOOD's ``when`` is on line 13."""
    return GOOD.format(name="bad").replace(old, new) + extra


def when(expr: str) -> str:
    return bad('"M >= 16"', json.dumps(expr))


BAD_CASES = [
    # (file text, expected line, message fragment)
    ('name = "bad"\npriority = \n', 2, "TOML syntax error"),
    ('name = "bad"\ngraph = """\nloop0 [M, para]\n', 2, "never closed"),
    (bad("priority = 5", "prio = 5"), 3, "unknown key 'prio'"),
    (bad(extra="\n[constraints]\nshape = 1\n"), 16, "unknown key 'shape'"),
    (bad('target = "llvm"', 'target = "llvm"\nflavor = 1'), 13, "unknown key 'flavor'"),
    ('name = "bad"\n[[implementation]]\nname = "x"\n', 1, "missing key 'graph'"),
    (GOOD.format(name="bad").split("\n[[implementation]]")[0] + "\n", 9, "[[implementation]]"),
    (GOOD.format(name="other"), 1, "does not match its file name"),
    (bad("priority = 5", 'priority = "high"'), 3, "an integer"),
    (bad("allow_epilogue = true", "allow_epilogue = 1"), 2, "true or false"),
    (bad("priority = 5", "priority = 5\nbatched = 2"), 4, "true or false"),
    (bad("[[implementation]]", "[implementation]"), 10, "write [[implementation]]"),
    (bad('"llvm"', '"tpu"'), 12, "unknown target 'tpu'"),
    (bad(extra='\n[constraints]\ndtype = ["float32", "floaty"]\n'), 16, "'floaty' is not a dtype"),
    # +Graph errors land on the real line of the file: graph = """ is line 4, loop1 line 6
    (bad("  loop1 [N, para]", "  loop1 [N, sometimes]"), 6, "bad +Graph"),
    (bad("    loop2 [K", "   loop2 [K"), 7, "bad +Graph"),
    (bad('graph = """\n', 'graph = """loop0 [M, para]\n  x\n'), 5, "bad +Graph"),
    # when conditions: parsed against a whitelist, never evaluated as Python
    (when("__import__('os')"), 13, "function call \"__import__('os')\""),
    (when("M >= x"), 13, "unknown size name 'x'"),
    (when("M.real > 1"), 13, "'M.real'"),
    (when("M + 1"), 13, "must be a condition"),
    (when("M >= 1.5"), 13, "'1.5' is not allowed"),
    (when("M / 2 > 1"), 13, "'M / 2' is not allowed"),
    (when("M >="), 13, "not a valid condition"),
]


@pytest.mark.parametrize("text, line, fragment", BAD_CASES)
def test_bad_entries_are_rejected_with_file_and_line(tmp_path, text, line, fragment):
    path = write(tmp_path, "bad", text)
    err = error_of(tmp_path, known_implementations=None)
    assert str(err).startswith(f"{path}:{line}: "), str(err)
    assert fragment in str(err)
    assert err.path == path and err.line == line and "\n" not in str(err)


def test_unknown_implementation_names_are_rejected_when_the_names_are_known(tmp_path):
    shipped = {i.name for e in load_warehouse() for i in e.implementations}
    path = write(tmp_path, "mine", GOOD.format(name="mine").replace("torch.linear", "my.gemm"))
    err = error_of(tmp_path, known_implementations=shipped | {"my.gem"})
    assert str(err).startswith(f"{path}:11: ") and "'my.gemm'" in str(err)
    assert "did you mean my.gem" in str(err)
    assert (
        len(load_warehouse([str(tmp_path)], known_implementations=shipped | {"my.gemm"}))
        == N_SHIPPED + 1
    )
    # shipped entries are checked too
    err = error_of(tmp_path, known_implementations={"my.gemm"})
    assert os.path.dirname(err.path) == package_dir()


def test_only_toml_files_are_read_and_no_code_runs(tmp_path):
    (tmp_path / "__init__.py").write_text("raise SystemExit('executed')")
    (tmp_path / "x.plus").write_text("garbage")
    assert len(load_warehouse([str(tmp_path)])) == N_SHIPPED


# ----------------------------------------------------------------------------- when routing
def test_when_evaluation_is_three_valued():
    impl = Implementation("x", "cuda", "M >= 512 and N * K // 2 % 7 == 5", 1)
    assert impl.evaluate({"M": 512, "N": 5, "K": 2}) is True
    assert impl.evaluate({"M": 511, "N": 5, "K": 2}) is False
    assert impl.evaluate({"M": 1024, "N": "n", "K": 2}) is None  # symbolic size
    assert impl.evaluate({"M": tvm.tirx.IntImm("int64", 600), "N": 5, "K": 2}) is True
    assert impl.evaluate({"M": tvm.tirx.Var("m", "int64"), "N": 5, "K": 2}) is None
    assert impl.evaluate({"M": 4, "N": "n"}) is False  # a known false decides ``and``
    assert Implementation("x", "any", "M >= 2 or N > 1", 1).evaluate({"M": 8}) is True
    assert Implementation("x", "any", "not M % 0 == 1", 1).evaluate({"M": 8}) is None
    assert Implementation("x", "any", None, 1).evaluate({}) is True
    assert impl.matches_target("cuda") and not impl.matches_target("llvm")
    assert Implementation("x", "any", None, 1).matches_target("llvm")


def test_entry_routes_attention_by_target_and_size():
    att = load_warehouse().get("attention")
    assert att.select("cuda", {"B": 8, "M": 1024, "N": 1024, "D": 64}).name == "torch.sdpa_flash"
    assert att.select("cuda", {"B": 8, "M": 128, "N": 128, "D": 64}).name == "torch.sdpa"
    assert att.select("llvm", {"B": 8, "M": 1024, "N": 1024, "D": 64}).name == "torch.sdpa"
    # symbolic M: undecidable here, the run-time router evaluates candidates per call
    assert att.select("cuda", {"M": "m"}).name == "torch.sdpa"
    assert [i.name for i in att.candidates("llvm")] == ["torch.sdpa"]


def test_check_when_whitelist():
    check_when("(M + 1) * 2 >= N and not K == 0 or -M < 3", {"M", "N", "K"})
    for bad in ("M if N else K", "[M]", "M ** 2 > 1", "lambda: 1", "True", "M >= 1 in N"):
        with pytest.raises(ValueError):
            check_when(bad, {"M", "N", "K"})


def test_constraints_admit_dtypes_and_static_sizes():
    c = Constraints(("float32",), True, None)
    assert c.admits(["float32"], {"M": 4})
    assert not c.admits(["float16"], {"M": 4})
    assert not c.admits(["float32"], {"M": "m"})
    assert Constraints().admits(["int8"], {"M": "m"})


def test_warehouse_rejects_duplicates_when_built_directly():
    e = load_warehouse().get("softmax")
    with pytest.raises(WarehouseError, match="duplicate"):
        Warehouse((e, e))


# ----------------------------------------------------------------------------- CLI
def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_warehouse_list(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "warehouse", "list")
    assert code == 0
    lines = out.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == [e.name for e in load_warehouse()]
    assert len(lines) == N_SHIPPED and set(SHIPPED) <= {ln.split()[0] for ln in lines}
    assert "torch.sdpa_flash@cuda" in lines[0] and "attention.toml" in lines[0]
    write(tmp_path, "mine", GOOD.format(name="mine"))
    code, out, _ = run_cli(capsys, "warehouse", "list", "--json", "--opt", f"warehouse={tmp_path}")
    rows = json.loads(out)
    assert code == 0 and len(rows) == N_SHIPPED + 1
    assert rows[0]["name"] == "attention" and rows[0]["implementations"][0]["target"] == "cuda"
    assert rows[-1]["name"] == "mine" and rows[-1]["path"].startswith(str(tmp_path))


def test_cli_warehouse_show(capsys):
    code, out, _ = run_cli(capsys, "warehouse", "show", "gemm_layernorm")
    assert code == 0
    assert "priority: 200" in out and "torch.linear_layernorm" in out
    assert "    loop2 [K, non-para, (dot)]" in out
    code, out, _ = run_cli(capsys, "warehouse", "show", "conv2d_epilogue", "--json")
    assert code == 0 and json.loads(out)["constraints"]["layout"] == "NCHW"
    code, _, err = run_cli(capsys, "warehouse", "show", "sofmax")
    assert code == 2 and "softmax" in err and len(err.strip().splitlines()) == 1


def test_cli_warehouse_validate(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "warehouse", "validate")
    assert code == 0 and out.strip() == f"ok: {N_SHIPPED} entries"
    write(tmp_path / "good", "mine", GOOD.format(name="mine"))
    code, out, _ = run_cli(capsys, "warehouse", "validate", str(tmp_path / "good"))
    assert code == 0 and out.strip() == f"ok: {N_SHIPPED + 1} entries"
    bad = write(tmp_path / "bad", "bad", GOOD.format(name="bad").replace("M >= 16", "M >= x"))
    code, out, err = run_cli(capsys, "warehouse", "validate", str(tmp_path / "bad"))
    assert code == 2 and not out
    assert err.strip().splitlines() == [err.strip()] and f"{bad}:13: " in err
    assert "Traceback" not in err
