"""The console's launch without Python's cyclic garbage collector.

Importing Textual and the console's modules, and laying out the first screen, make about 110,000
objects that nearly all stay alive (modules, classes, functions, styles, widgets), so the
collections that run meanwhile find next to nothing to free: measured on the VM, about 160 of
them up to the first frame, 41 ms, one a full collection of every object (15 ms). `pause()` stops
them from the start of `main()`, and the console calls `resume(freeze=True)` once its first frame
with data is on screen (or a few seconds after its start without one): one full collection frees
what the launch left in cycles (about 4,000 objects; 25-30 ms on the VM, after the first frame
rather than before it), then what is left is moved out of later collections' way (gc.freeze), so
a full collection does not walk it again each time, and collections run again as before. Every
other command resumes as soon as it is parsed.
"""

import gc

_paused = False


def pause() -> None:
    """Stop cyclic collections until resume() (nothing if the collector is off already)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume(freeze: bool = False) -> None:
    """Collections again if pause() stopped them; `freeze`: first collect the cycles the launch
    left, then keep what is alive out of every later collection (the launch's modules, classes
    and first screen stay alive anyway; a frozen cycle would never be freed)."""
    global _paused
    if not _paused:
        return
    _paused = False
    if freeze:
        gc.collect()
        gc.freeze()
    gc.enable()


def paused() -> bool:
    """Whether pause() has stopped the collector and resume() has not run yet."""
    return _paused
