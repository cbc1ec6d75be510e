"""A torch module made ready for ``torch.export`` the way a user hands it over, never changed.

- **Training mode**: a module left in ``train()`` whose graph behaves differently in training
  (an op with a ``train`` / ``training`` argument set: dropout, batch norm with batch statistics)
  is refused, naming the module and the op (:func:`training_ops`); ``Options(train_mode="eval")``
  compiles an eval-mode copy instead (:func:`eval_copy`: new module objects, the same tensors).
- **transformers' KV cache** (``use_cache`` on by default): the cache object is no model output
  ``torch.export`` can return, so the export runs with ``config.use_cache`` off and the user's
  config restored after it (:func:`cache_off`); a warning says the cache outputs are not
  returned (text generation with a cache: ``plus_tvm.compile_lm``).
- **Keyword example inputs** are put in the order of ``forward``'s parameters
  (:func:`ordered_kwargs`), so that the compiled model's inputs follow the signature; plain
  values among them (``return_dict=False``) are bound into the forward (:func:`bind_constants`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import warnings
from collections.abc import Iterator, Mapping

from .errors import ModelLoadError

TRAIN_MODES = ("refuse", "eval")
_TRAIN_ARGS = ("train", "training")
_DROPOUT_ARGS = ("p", "dropout")  # the probability arguments of dropout ops and RNNs


def training_ops(program: object) -> list[tuple[str, str, str]]:
    """``(module path, module class, op)`` of each op of ``program`` (an exported program, not
    yet decomposed) that runs in training mode: a ``train`` / ``training`` argument set."""
    found = []
    for node in program.graph.nodes:
        if node.op != "call_function" or not _training_set(node):
            continue
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        path, cls = stack[-1] if stack else ("", "the model")
        packet = getattr(node.target, "_overloadpacket", None)  # (dropout, not dropout.default)
        op = getattr(packet, "__name__", None) or getattr(node.target, "__name__", str(node.target))
        found.append((str(path), str(cls).rsplit(".", 1)[-1], op))
    return found


def _training_set(node: object) -> bool:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    values = {
        arg.name: node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
        for i, arg in enumerate(schema.arguments)
    }
    if not any(values.get(name) is True for name in _TRAIN_ARGS):
        return False
    # a dropout of probability 0 (an RNN's default) is the same in both modes
    return not any(values.get(name) in (0, 0.0) for name in _DROPOUT_ARGS)


def training_message(name: str, found: list[tuple[str, str, str]]) -> str:
    path, cls, op = found[0]
    where = f"{cls} at '{path}'" if path else cls
    more = f" (and {len(found) - 1} more op(s))" if len(found) > 1 else ""
    return (
        f"{name} is in training mode: {where} runs {op} with training semantics{more}, which a "
        "compiled model cannot reproduce; call model.eval() before compiling, or compile an "
        'eval-mode copy with Options(train_mode="eval")'
    )


def eval_copy(module: object) -> object:
    """An eval-mode copy of ``module`` sharing its parameters and buffers (the compiled model
    still follows in-place updates of the user's weights); ``module`` is not changed."""
    memo = {id(t): t for t in (*module.parameters(), *module.buffers())}
    copied = copy.deepcopy(module, memo)
    return copied.eval()


@contextlib.contextmanager
def cache_off(module: object, kwargs: Mapping[str, object]) -> Iterator[bool]:
    """Within the block, every transformers config of ``module`` has ``use_cache`` off (unless
    the caller passes ``use_cache`` itself); yields whether any was on. The configs are restored
    after, also on error."""
    if "use_cache" in kwargs:
        yield False
        return
    turned = []
    seen = set()
    for sub in module.modules():
        config = getattr(sub, "config", None)
        if config is None or id(config) in seen:
            continue
        seen.add(id(config))
        if getattr(config, "use_cache", None) is True:
            turned.append(config)
    try:
        for config in turned:
            config.use_cache = False
        yield bool(turned)
    finally:
        for config in turned:
            config.use_cache = True


def warn_cache_dropped(name: str) -> None:
    warnings.warn(
        f"{name}: compiled with use_cache=False: the KV-cache outputs (past_key_values) are not "
        "returned; for text generation with a cache use plus_tvm.compile_lm",
        UserWarning,
        stacklevel=5,
    )


_CONSTANTS = (bool, int, float, str, type(None))


def bind_constants(module: object, kwargs: Mapping[str, object]) -> tuple[object, dict]:
    """``(module, tensor kwargs)``: keyword inputs that are plain values (``use_cache=False``,
    ``return_dict=False``) bound into the forward of a shallow copy of ``module`` (the same
    submodules and weights, under the same names), as ``torch.export`` would bake them in; the
    tensors stay inputs. ``module`` itself is not changed."""
    constants = {k: v for k, v in kwargs.items() if isinstance(v, _CONSTANTS)}
    if not constants:
        return module, dict(kwargs)
    if constants.get("use_cache") is True:
        raise ModelLoadError(
            "use_cache=True: the KV cache is no output a compiled model returns; leave use_cache "
            "out (the model is compiled without its cache) or, for text generation with a "
            "cache, use plus_tvm.compile_lm"
        )
    bound = copy.copy(module)
    bound.forward = functools.partial(type(module).forward, bound, **constants)
    return bound, {k: v for k, v in kwargs.items() if k not in constants}


def ordered_kwargs(module: object, kwargs: Mapping[str, object]) -> dict[str, object]:
    """``kwargs`` in the order of ``module.forward``'s parameters (names it does not list, taken
    by a ``**kwargs``, after them in the order given)."""
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):  # a forward without a readable signature
        return dict(kwargs)
    rank = {name: i for i, name in enumerate(params)}
    keys = sorted(kwargs, key=lambda k: rank.get(k, len(rank)))
    return {k: kwargs[k] for k in keys}
