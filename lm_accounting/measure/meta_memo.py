"""Meta kernels run once per distinct input: the storage tracker's fast path on ``meta``.

On ``meta`` an op computes nothing.  Its output's shape, strides and dtype follow from its inputs'
metadata (shape, strides, dtype, storage offset), its other arguments and torch's default dtype,
and from nothing else: there is no data.  torch runs many meta kernels in Python, through its
``_refs`` decompositions (torch/_meta_registrations.py, ``activate_meta``): ``aten.mul.Tensor``
takes ~100 µs there against ~1 µs for ``torch.empty_strided``, and a foreach op calls such a
kernel once per tensor.  A model repeats the same ops on the same shapes in every block, and
AdamW the same foreach ops in every step, so ``MetaMemo`` runs each kernel once per distinct input:

* ``OUTPUTS``: an aten op whose returns are ``Tensor`` or ``Tensor[]`` with no alias annotation,
  with no annotated (mutable or aliasing) argument, at least one tensor argument (no factory reads
  global state) and no random-number tag.  Afterwards it returns fresh ``empty_strided`` tensors of
  the shapes, strides and dtypes the kernel returned: new storages of the same bytes, which is all
  the tracker counts.  Remembered only if each output is a plain strided tensor on ``meta``, at
  storage offset 0, on a storage of its own whose bytes equal what ``empty_strided`` allocates for
  its shape and strides (not an input's storage, not padded).
* ``CHECKED``: an in-place pointwise or foreach aten op (tags ``inplace`` and ``pointwise``, or a
  ``_foreach_`` name; never ``inplace_view``) whose only mutable argument is ``self``.  On ``meta``
  it changes no data and no metadata: its kernel only checks that the inputs broadcast into
  ``self`` and that the result's dtype casts to ``self``'s, which depends on the metadata and on
  each scalar's type, not its value (AdamW's bias-corrected step sizes change every step).
  Afterwards the check is not run again; the op returns what it returned, None or ``self``.  A foreach
  op's check runs on one position per distinct metadata of its lists (``distinct_positions``).

A call is keyed only when every tensor in it is a plain strided, non-complex tensor on ``meta``;
anything else (a tensor on the CPU, a subclass, an unhashable argument) runs the kernel.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

META = torch.device("meta")
PLAIN = (torch.Tensor, torch.nn.Parameter)
OUTPUTS, CHECKED = "outputs", "checked"  # what is remembered of an op (see the module's note)


class Unkeyed(Exception):
    """A call whose output is not a function of metadata the memo can key on."""


def metadata_key(x, values: bool = True):
    """A hashable key of ``x``: a meta tensor's metadata, a list's keys, a scalar's type (and value)."""
    kind = type(x)
    if kind in PLAIN:
        if not x.is_meta or x.layout is not torch.strided or x.dtype.is_complex:
            raise Unkeyed
        return (x.shape, x.stride(), x.dtype, x.storage_offset())
    if kind is tuple or kind is list:
        return tuple([metadata_key(y, values) for y in x])
    if isinstance(x, torch.Tensor):  # a subclass: its own dispatch may matter
        raise Unkeyed
    return (kind, x) if values else kind  # True, 1 and 1.0 promote differently


def memo_kind(func) -> str | None:
    """``OUTPUTS``, ``CHECKED`` or None (always run the kernel), from ``func``'s schema and tags."""
    schema = getattr(func, "_schema", None)
    if schema is None or getattr(func, "namespace", None) != "aten" or torch.Tag.nondeterministic_seeded in func.tags:
        return None
    args, rets = schema.arguments, schema.returns
    if not any("Tensor" in str(a.type) for a in args):
        return None
    if all(a.alias_info is None for a in args):
        fresh = rets and all(str(r.type) in ("Tensor", "List[Tensor]") and r.alias_info is None for r in rets)
        return OUTPUTS if fresh else None
    inplace = torch.Tag.inplace in func.tags and torch.Tag.inplace_view not in func.tags
    elementwise = torch.Tag.pointwise in func.tags or schema.name.startswith("aten::_foreach_")
    self_only = [a.name for a in args if a.alias_info is not None and a.alias_info.is_write] == ["self"]
    aliases_only_self = all(a.alias_info is None or a.name == "self" for a in args)
    return CHECKED if inplace and elementwise and self_only and aliases_only_self else None


def _storages(x, into: set) -> set:
    if isinstance(x, torch.Tensor):
        into.add(id(x.untyped_storage()))
    elif isinstance(x, (list, tuple)):
        for y in x:
            _storages(y, into)
    return into


def output_specs(out, args, kwargs) -> tuple | None:
    """(shape, stride, dtype) of each output, or None where ``empty_strided`` would not rebuild it."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
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


def distinct_positions(args: tuple) -> tuple | None:
    """A foreach call's arguments with its lists cut to one position per distinct metadata (and scalar type)
    of their entries, or None where the lists differ in length (the kernel's own check must see them).  An
    in-place foreach kernel on meta checks each position on its own (the per-tensor op), so the cut call
    passes or fails as the whole one does; AdamW's ~600 positions have a dozen distinct shapes."""
    lists = [i for i, a in enumerate(args) if type(a) is list]
    lengths = {len(args[i]) for i in lists}
    if len(lengths) != 1:
        return None
    first: dict = {}
    for j in range(lengths.pop()):
        first.setdefault(tuple(metadata_key(args[i][j], False) for i in lists), j)
    keep = sorted(first.values())
    return tuple([a[j] for j in keep] if i in lists else a for i, a in enumerate(args))


def _rebuild(specs: tuple, container: type):
    outs = [torch.empty_strided(shape, stride, dtype=dtype, device=META) for shape, stride, dtype in specs]
    return outs if container is list else tuple(outs) if container is tuple else outs[0]


class MetaMemo:
    """``memo(func, args, kwargs)`` is ``func(*args, **kwargs)``, from memory where that is exact."""

    def __init__(self):
        self.kinds: dict = {}  # func -> memo_kind(func)
        self.known: dict = {}  # key -> OUTPUTS: (specs, list, tuple or Tensor); CHECKED: "none" or "self"
        self.hits = self.misses = 0

    def __call__(self, func, args, kwargs):
        kwargs = kwargs or {}
        kind = self.kinds.get(func, False)
        if kind is False:
            kind = self.kinds[func] = memo_kind(func)
        if kind is None:
            return func(*args, **kwargs)
        try:
            values = kind is OUTPUTS
            call = (metadata_key(args, values), metadata_key(tuple(kwargs.items()), values))
            key = (func, torch.get_default_dtype(), *call)
            known = self.known.get(key, False)
        except (Unkeyed, TypeError):  # a tensor off meta, an unhashable argument
            return func(*args, **kwargs)
        if known:
            self.hits += 1
            if kind is CHECKED:
                return None if known == "none" else args[0]
            return _rebuild(*known)
        if known is None:
            return func(*args, **kwargs)
        self.misses += 1
        if kind is OUTPUTS:
            out = func(*args, **kwargs)
            specs = output_specs(out, args, kwargs)
            self.known[key] = None if specs is None else (specs, type(out))
            return out
        foreach = func._schema.name.startswith("aten::_foreach_") and not any(type(v) is list for v in kwargs.values())
        out = func(*((foreach and distinct_positions(args)) or args), **kwargs)
        self.known[key] = "none" if out is None else "self" if out is args[0] else None
        return out


class MetaMemoMode(TorchDispatchMode):
    """Runs every op through ``memo`` and counts nothing (a warm-up that fills the tracker's memo)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as StorageTracker: no torch.compile here

    def __init__(self, memo: MetaMemo):
        super().__init__()
        self.memo = memo

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.memo(func, args, kwargs)
