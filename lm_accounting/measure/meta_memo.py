"""Meta kernels run once per distinct input: the storage tracker's fast path on ``meta``.

On ``meta`` an op computes nothing.  Its output's shape, strides and dtype follow from its inputs'
metadata (shape, strides, dtype, storage offset), its other arguments and torch's default dtype,
and from nothing else: there is no data.  torch runs many meta kernels in Python, through its
``_refs`` decompositions (torch/_meta_registrations.py, ``activate_meta``): ``aten.mul.Tensor``
takes ~100 µs there against ~1 µs for ``torch.empty_strided``.  A model repeats the same ops on
the same shapes in every block, so ``MetaMemo`` runs each op's kernel once per distinct input and
afterwards returns a fresh ``empty_strided`` tensor of the shape, strides and dtype it returned:
a new storage of the same bytes, which is all the tracker counts.

Only ops that cannot alias or mutate are remembered: aten ops whose returns are plain ``Tensor``
with no alias annotation, with no annotated (mutable or aliasing) argument, at least one tensor
argument (no factory reads global state) and no random-number tag.  A call is remembered only
when every tensor in it is a plain strided, non-complex tensor on ``meta``, and only if each
output is such a tensor, at storage offset 0, on a storage of its own whose bytes equal what
``empty_strided`` allocates for its shape and strides; anything else (an output that is an
input's storage, a padded storage) runs the kernel every time.  Any other call runs the kernel.
"""

from __future__ import annotations

import torch

META = torch.device("meta")
PLAIN = (torch.Tensor, torch.nn.Parameter)


class Unkeyed(Exception):
    """A call whose output is not a function of metadata the memo can key on."""


def metadata_key(x):
    """A hashable key of ``x``: a meta tensor's metadata, a list's keys, a scalar's type and value."""
    if isinstance(x, torch.Tensor):
        if not x.is_meta or type(x) not in PLAIN or x.layout is not torch.strided or x.dtype.is_complex:
            raise Unkeyed
        return (x.shape, x.stride(), x.dtype, x.storage_offset())
    if isinstance(x, (list, tuple)):
        return tuple(metadata_key(y) for y in x)
    return (type(x), x)  # True, 1 and 1.0 promote differently


def rememberable(func) -> bool:
    """Whether ``func``'s schema allows remembering its outputs (see the module's note)."""
    schema = getattr(func, "_schema", None)
    return (
        schema is not None
        and getattr(func, "namespace", None) == "aten"
        and bool(schema.returns)
        and all(str(r.type) == "Tensor" and r.alias_info is None for r in schema.returns)
        and all(a.alias_info is None for a in schema.arguments)
        and any("Tensor" in str(a.type) for a in schema.arguments)
        and torch.Tag.nondeterministic_seeded not in func.tags
    )


def _storages(x, into: set) -> set:
    if isinstance(x, torch.Tensor):
        into.add(id(x.untyped_storage()))
    elif isinstance(x, (list, tuple)):
        for y in x:
            _storages(y, into)
    return into


def output_specs(out, args, kwargs) -> tuple | None:
    """(shape, stride, dtype) of each output, or None where ``empty_strided`` would not rebuild it."""
    outs = out if isinstance(out, tuple) else (out,)
    seen = _storages((args, tuple(kwargs.values())), set())
    specs = []
    for o in outs:
        if type(o) is not torch.Tensor or not o.is_meta or o.storage_offset() or o.requires_grad:
            return None
        storage = o.untyped_storage()
        if id(storage) in seen:  # an input's storage, or another output's
            return None
        seen.add(id(storage))
        shape, stride = o.shape, o.stride()
        rebuilt = torch.empty_strided(shape, stride, dtype=o.dtype, device=META)
        if rebuilt.untyped_storage().nbytes() != storage.nbytes():
            return None
        specs.append((shape, stride, o.dtype))
    return tuple(specs)


class MetaMemo:
    """``memo(func, args, kwargs)`` is ``func(*args, **kwargs)``, from memory where that is exact."""

    def __init__(self):
        self.ops: dict = {}  # func -> rememberable(func)
        self.outputs: dict = {}  # key -> output_specs (None: always run the kernel)
        self.hits = self.misses = 0

    def __call__(self, func, args, kwargs):
        kwargs = kwargs or {}
        ok = self.ops.get(func)
        if ok is None:
            ok = self.ops[func] = rememberable(func)
        if not ok:
            return func(*args, **kwargs)
        try:
            key = (func, torch.get_default_dtype(), metadata_key(args), metadata_key(tuple(kwargs.items())))
            specs = self.outputs.get(key, False)
        except (Unkeyed, TypeError):  # a tensor off meta, an unhashable argument
            return func(*args, **kwargs)
        if specs:
            self.hits += 1
            outs = tuple(torch.empty_strided(shape, stride, dtype=dtype, device=META) for shape, stride, dtype in specs)
            return outs[0] if len(outs) == 1 else outs
        out = func(*args, **kwargs)
        if specs is False:
            self.misses += 1
            self.outputs[key] = output_specs(out, args, kwargs)
        return out
