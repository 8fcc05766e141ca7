"""How the kernel writes a cell's exception: its own clipped form, or the training harness's shape.

Stdlib only: its source is sent ahead of kernel.py's (see bootstrap.kernel_payload) and runs in
the kernel's namespace, after capture.py's (`clip`). User exceptions are hostile too: str(exc)
may raise (which used to end the kernel) or be huge (a 64 MB message overflowed the host's frame
cap): neither function raises, and both clip the text to `limit` characters.
"""

import traceback

if "clip" not in globals():
    from rlm_mcp.sandbox.guest.capture import clip


def cell_error(exc: BaseException, limit: int) -> str:
    try:
        name = type(exc).__name__
    except BaseException:
        name = "Exception"
    try:
        message = clip(str(exc), limit)
    except BaseException:
        message = "<the exception's str() failed>"
    try:
        tb = exc.__traceback__
        while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
            tb = tb.tb_next
        if isinstance(exc, SyntaxError):
            body = "".join(traceback.format_exception_only(type(exc), exc))
        else:
            body = "".join(traceback.format_exception(type(exc), exc, tb))
    except BaseException:
        body = ""
    return clip(f"{name}: {message}" + "\n" + clip(body.rstrip(), limit), limit)


def cell_error_as_trained(exc: BaseException, filename: str, limit: int) -> str | None:
    # The training harness's shape (rlm_train/worker.py): "\nType: message", then a newline and
    # the traceback. Only the cell's own frames are shown (training's also named its worker's
    # files), named as exec() of a string names them, without source lines: as in training.
    try:
        if isinstance(exc, SyntaxError) and exc.filename == filename:
            exc.filename = "<string>"
        try:
            message = clip(str(exc), limit)
        except BaseException:
            message = "<the exception's str() failed>"
        kept: list[traceback.FrameSummary] = []
        for frame in traceback.StackSummary.extract(traceback.walk_tb(exc.__traceback__), lookup_lines=False):
            if frame.filename.startswith("<cell"):
                frame.filename = "<string>"
            if kept or frame.filename == "<string>":
                kept.append(frame)
        body = "Traceback (most recent call last):\n" + "".join(traceback.StackSummary.from_list(kept).format())
        body += "".join(traceback.format_exception_only(type(exc), exc))
        return f"\n{type(exc).__name__}: {message}\n{clip(body, limit)}"
    except BaseException:
        return None
