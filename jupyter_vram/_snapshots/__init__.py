"""PyTorch allocator snapshot files in and out: ``_dump_snapshot`` pickles <-> Profiles.

Apart from the recorders (:mod:`jupyter_vram._capture`) because reading a file is not
recording: no torch call, no private torch API, only plain data from a pickle that is never
allowed to run code. It sits above the recorders and uses the conversion the CUDA recorder
ends with (:func:`jupyter_vram._capture.cuda_convert.profile_from_snapshot`, and its public
pieces: the profile builder, the allocator's block helpers, the stack interner); nothing in
``_capture`` imports from here.

The modules, lowest first:

* :mod:`.columns`: a device's trace as integer columns, converted to a Profile with numpy;
* :mod:`.reader`: the pickle interpreter that writes trace entries straight to columns;
* :mod:`.bulk`: long runs of entries decoded with array operations (the interpreter's subclass);
* :mod:`.stream`: the streaming reader's entry point;
* :mod:`.file`: the files themselves (safe unpickling, devices, labels recovered from stacks,
  writing a Profile as a snapshot PyTorch's viewers load).

Where each module here is tested: tests/INDEX.md.
"""
