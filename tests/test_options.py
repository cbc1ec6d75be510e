"""plus_tvm.Options: defaults, immutability, stable digest, --opt parsing, validation."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
from plus_tvm import Options, OptionsError
from plus_tvm.options import field_names


def test_defaults():
    opts = Options()
    assert opts.fusion == "dp"
    assert (opts.fusion_search, opts.fusion_rules) == ("dp", "mapping")
    assert opts.fusion_max_group_size == 64 and opts.fusion_seed == 0
    assert opts.dispatch is True and opts.dispatch_cost_model is True
    assert opts.warehouse == ()
    assert opts.gir == "auto"  # on for CPU targets, off for GPU ones
    assert opts.cuda_graph == "auto"  # graphs where they pay, on CUDA targets only
    assert opts.fold_constants is True
    assert opts.dump_ir is None
    assert set(field_names()) >= {"fusion", "dispatch", "warehouse", "gir", "cuda_graph"}


def test_frozen_and_hashable():
    opts = Options()
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.fusion = "dp"  # type: ignore[misc]
    assert hash(opts) == hash(Options())
    assert opts == Options()
    assert len({Options(), Options(), Options(gir="auto")}) == 1


def test_warehouse_list_and_str_become_tuples():
    assert Options(warehouse=["a", "b"]).warehouse == ("a", "b")
    assert Options(warehouse="a").warehouse == ("a",)
    hash(Options(warehouse=["a"]))  # a list left in place would make this raise TypeError


def test_digest_is_stable_and_hex():
    digest = Options().digest()
    assert digest == Options().digest()
    assert len(digest) == 16 and int(digest, 16) >= 0


def test_digest_same_in_another_process():
    # Different hash seed: the digest must not depend on Python's randomised hash().
    code = "from plus_tvm.options import Options; print(Options(warehouse=('x', 'y')).digest())"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == Options(warehouse=("x", "y")).digest()


@pytest.mark.parametrize(
    "change",
    [
        {"warehouse": ("extra",)},
        {"fold_constants": False},
        {"dump_ir": "/tmp/ir"},
        {"cuda_graph": "always"},
    ],
)
def test_digest_changes_with_any_field(change):
    assert Options(**change).digest() != Options().digest()


def test_digest_depends_on_warehouse_order():
    assert Options(warehouse=("a", "b")).digest() != Options(warehouse=("b", "a")).digest()


def test_to_dict_is_json_ready():
    d = Options(warehouse=("a",)).to_dict()
    assert d["warehouse"] == ["a"]
    assert set(d) == set(field_names())


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("true", True),
        ("1", True),
        ("YES", True),
        ("on", True),
        ("false", False),
        ("0", False),
        ("No", False),
        ("off", False),
    ],
)
def test_from_pairs_bools(raw, expected):
    assert Options.from_pairs([f"fold_constants={raw}"]).fold_constants is expected


def test_from_pairs_tuple_none_and_strings():
    opts = Options.from_pairs(["warehouse= a, b ,,c", "dump_ir=/tmp/x", "cuda_graph=always"])
    assert opts.warehouse == ("a", "b", "c")
    assert opts.dump_ir == "/tmp/x"
    assert opts.cuda_graph == "always"
    cleared = Options.from_pairs(["dump_ir=none"], base=opts)
    assert cleared.dump_ir is None
    assert cleared.warehouse == ("a", "b", "c")  # base kept


def test_from_pairs_accepts_dashes_in_keys():
    assert Options.from_pairs(["fold-constants=false"]).fold_constants is False


def test_from_pairs_unknown_key_names_it():
    with pytest.raises(OptionsError, match="bogus_knob"):
        Options.from_pairs(["bogus_knob=1"])


def test_from_pairs_bad_bool():
    with pytest.raises(OptionsError, match="fold_constants.*maybe"):
        Options.from_pairs(["fold_constants=maybe"])


def test_from_pairs_needs_equals():
    with pytest.raises(OptionsError, match="KEY=VALUE"):
        Options.from_pairs(["fusion"])


def test_bad_choice_rejected():
    with pytest.raises(OptionsError, match="fusion"):
        Options(fusion="greedy")
    with pytest.raises(OptionsError, match="cuda_graph"):
        Options.from_pairs(["cuda_graph=sometimes"])


def test_non_bool_rejected():
    with pytest.raises(OptionsError, match="dispatch"):
        Options(dispatch=0)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["auto", "off", "always"])
def test_every_cuda_graph_mode_is_available(mode):
    assert Options.from_pairs([f"cuda_graph={mode}"]).cuda_graph == mode


def test_replace():
    base = Options()
    changed = base.replace(fold_constants=False, warehouse=["w"])
    assert changed.fold_constants is False
    assert changed.warehouse == ("w",)
    assert base.fold_constants is True  # original untouched
    assert changed.digest() != base.digest()


def test_replace_validates():
    with pytest.raises(OptionsError, match="nope"):
        Options().replace(nope=1)
    with pytest.raises(OptionsError, match="cuda_graph"):
        Options().replace(cuda_graph="sometimes")
    with pytest.raises(OptionsError, match="gir"):
        Options().replace(gir="maybe")


def test_gir_choices_and_targets():
    from plus_tvm.target import resolve_target

    assert Options(gir=True).gir == "on" and Options(gir=False).gir == "off"
    assert Options.from_pairs(["gir=true"]).gir == "on"
    assert Options.from_pairs(["gir=off"]).gir == "off"
    llvm, cuda = resolve_target("llvm"), resolve_target({"kind": "cuda", "arch": "sm_90"})
    assert Options().gir_enabled(llvm) and not Options().gir_enabled(cuda)
    assert Options(gir="on").gir_enabled(cuda) and not Options(gir="off").gir_enabled(llvm)


# ------------------------------------------------------- compile inputs read once into Options
def test_resolve_inputs_reads_the_environment_once_into_fields(tmp_path, monkeypatch):
    """$PLUS_TVM_WAREHOUSE, the GIR model's bandwidths and TVM's pool size become fields of the
    options a compile runs with, so the digest changes with them; set fields are kept."""
    from plus_tvm.compile_inputs import resolve_inputs
    from plus_tvm.gir.model import cpu_figures, runtime_threads
    from plus_tvm.pattern_warehouse import ENV_VAR
    from plus_tvm.target import resolve_target

    llvm = resolve_target("llvm")
    folder = tmp_path / "entries"
    folder.mkdir()
    monkeypatch.delenv(ENV_VAR, raising=False)
    plain = resolve_inputs(llvm, Options())
    assert plain.warehouse_env == ()
    assert plain.gir_global_gbps == cpu_figures(llvm)["global_gbps"] > 0
    assert plain.gir_cache_gbps == cpu_figures(llvm)["cache_gbps"] > 0
    pool = plain.cpu_parallel  # OpenMP's where the native library is built, else TVM's
    assert plain.gir_launch_us == cpu_figures(llvm, pool)["launch_us"] > 0
    assert plain.threads == runtime_threads(pool) >= 1
    assert resolve_inputs(llvm, plain) == plain  # idempotent
    monkeypatch.setenv(ENV_VAR, str(folder))
    with_env = resolve_inputs(llvm, Options())
    assert with_env.warehouse_env == (str(folder),)
    assert with_env.digest() != plain.digest()
    mine = Options(warehouse_env=(), threads=3, gir_global_gbps=7.5)
    kept = resolve_inputs(llvm, mine)
    assert (kept.warehouse_env, kept.threads, kept.gir_global_gbps) == ((), 3, 7.5)
    # GPU targets: only the warehouse is read (their model figures are per architecture)
    cuda = resolve_inputs(resolve_target({"kind": "cuda", "arch": "sm_90"}), Options())
    assert cuda.warehouse_env == (str(folder),) and cuda.threads == 0


def test_stats_name_the_resolved_inputs_and_the_gir_model_reads_them(monkeypatch):
    """What a compile read is in stats["options"]; the GIR rule plans with those figures."""
    import plus_tvm
    from plus_tvm.compile_inputs import gir_machine
    from plus_tvm.pattern_warehouse import ENV_VAR
    from plus_tvm.target import resolve_target
    from torch import nn

    monkeypatch.delenv(ENV_VAR, raising=False)
    stats = plus_tvm.inspect(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), example_args=(_x(),))
    used = stats["options"]
    assert used["warehouse_env"] == [] and used["threads"] >= 1 and used["gir_global_gbps"] > 0
    llvm = resolve_target("llvm")
    machine = gir_machine(llvm, Options(gir_global_gbps=12.0, gir_cache_gbps=34.0, threads=1))
    assert (machine.global_gbps, machine.cache_gbps, machine.units) == (12.0, 34.0, 1)
    assert machine.measured
    slow_pool = gir_machine(llvm, Options(gir_launch_us=80.0))
    assert slow_pool.launch_ns == 80000.0 and slow_pool.measured


def test_optional_tuple_and_number_options_parse():
    opts = Options.from_pairs(["warehouse_env=a,b", "threads=2", "gir_cache_gbps=50"])
    assert opts.warehouse_env == ("a", "b") and opts.threads == 2 and opts.gir_cache_gbps == 50.0
    assert Options.from_pairs(["warehouse_env=none"]).warehouse_env is None
    with pytest.raises(OptionsError, match="gir_global_gbps"):
        Options(gir_global_gbps=-1.0)
    with pytest.raises(OptionsError, match="threads"):
        Options(threads=-2)


def _x():
    import torch

    return torch.randn(2, 8)
