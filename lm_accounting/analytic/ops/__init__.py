"""The op library (issue 26, ``/work/ops_spec.md``): symbolic tensors and autograd (``tensors``), aten-level
primitives (``aten``), and programs written like the model code they follow (``transformers``, ``course``),
evaluated by the engine of ``engine``.  No torch here."""
