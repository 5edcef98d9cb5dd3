"""Output is plain text unless a terminal asks for more: no escape codes in pipes and job logs."""

from __future__ import annotations

import importlib.util
import os
import pty
import subprocess
import sys

import pytest

VAR = "NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING"
PROBE = ("import os, mpikmeans, numba.core.errors as e; "
         "print(os.environ.get('" + VAR + "')); "
         "print(repr(str(e.NumbaPerformanceWarning('a slow launch'))))")


def _env_without_the_setting():
    env = dict(os.environ)
    env.pop(VAR, None)  # the test process imported mpikmeans and set it: a child must decide for itself
    return env


def test_piped_output_turns_numba_highlighting_off():
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=_env_without_the_setting(),
                       timeout=120)
    assert p.returncode == 0, p.stderr
    setting, warning = p.stdout.splitlines()
    assert setting == "1"
    assert "\\x1b" not in warning and "\x1b" not in p.stdout + p.stderr


def test_a_users_own_setting_is_kept():
    env = _env_without_the_setting()
    env[VAR] = "0"
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and p.stdout.splitlines()[0] == "0", p.stderr


def test_a_terminal_keeps_numba_default():
    # stderr a terminal: the user sees what Numba would show them (bold, where colorama is installed)
    out_r, out_w = os.pipe()
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", PROBE], stdout=out_w, stderr=slave, env=_env_without_the_setting())
    os.close(out_w)
    os.close(slave)
    try:
        out = b""
        while chunk := os.read(out_r, 4096):
            out += chunk
    finally:
        assert p.wait(timeout=120) == 0
        os.close(out_r)
        os.close(master)
    setting, warning = out.decode().splitlines()
    assert setting == "None"
    if importlib.util.find_spec("colorama") is None:
        pytest.skip("colorama is not installed: Numba never highlights here")
    assert "\\x1b" in warning
