"""torchrun launches for the multi-process tests, with one retry for gloo's start-up abort.

On a loaded 2-core machine a gloo rank now and then aborts while the process group connects
("terminate called without an active exception", SIGABRT, before any Python frame runs). The
launch is retried once, from a clean output folder, only on that exact signature: a real failure
of the code under test repeats and fails the test.
"""
import shutil
import subprocess
import sys

GLOO_START_ABORT = "terminate called without an active exception"


def torchrun(args, env, out=None, timeout=600, cwd=None):
    """`python -m torch.distributed.run --standalone ARGS`; returns the CompletedProcess."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", *args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if r.returncode != 0 and GLOO_START_ABORT in r.stderr:
        print(f"gloo start-up abort, retrying once:\n{r.stderr[-1500:]}", file=sys.stderr)
        if out is not None:
            shutil.rmtree(out, ignore_errors=True)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    return r
