"""The Python API is quiet by default: torch's FutureWarnings and TVM's log lines about its own
internals do not reach the user's stderr; anything else native code writes still does, and
Options(verbose=True) keeps everything."""

from __future__ import annotations

import subprocess
import sys
import textwrap

COMPILE = """
import torch, plus_tvm
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
cm = plus_tvm.compile(m, example_args=(torch.randn(2, 8),),
                      options=plus_tvm.Options(verbose={verbose}))
print(tuple(cm(torch.randn(2, 8)).shape))
"""


def _stderr(code: str) -> tuple[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def test_a_compile_prints_no_torch_future_warning_unless_verbose():
    out, err = _stderr(COMPILE.format(verbose=False))
    assert "(2, 8)" in out
    assert "FutureWarning" not in err, err
    _, err = _stderr(COMPILE.format(verbose=True))
    assert "FutureWarning" in err  # torch.export's LeafSpec warning, kept when asked


def test_native_noise_is_dropped_and_everything_else_written_back():
    _, err = _stderr(
        """
        import os, threading
        from plus_tvm import quiet
        def noisy():
            with quiet.filtered():
                os.write(2, b"Warning: Fast mode segfaults when there are out-of-bounds indices\\n")
                os.write(2, b"a line the user must see\\n")
        threads = [threading.Thread(target=noisy) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        os.write(2, b"after the capture\\n")
        """
    )
    assert "Fast mode segfaults" not in err
    assert err.count("a line the user must see") == 4
    assert err.rstrip().endswith("after the capture")  # descriptor 2 restored


def test_the_clis_capture_drops_everything_even_around_an_api_compile():
    _, err = _stderr(
        """
        import os
        from plus_tvm import quiet
        with quiet.quiet():  # the CLI's
            with quiet.filtered():  # plus_tvm.compile inside it
                os.write(2, b"a native line inside the compile\\n")
            os.write(2, b"a native line after it\\n")
        os.write(2, b"after the capture\\n")
        """
    )
    assert "native line" not in err
    assert err.rstrip().endswith("after the capture")
