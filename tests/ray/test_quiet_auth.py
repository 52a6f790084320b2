"""The embedded Ray keeps token authentication on and says nothing about turning it off.

Ray's own default for a new local cluster is token auth, announced with a warning that tells
users how to opt out ("Set RAY_AUTH_MODE=disabled"). `collage_farm.farm.connect` turns the same
default on itself, quietly. A fresh interpreter with ``RAY_AUTH_MODE`` unset and a ``HOME`` of
its own (so the token Ray creates is this test's) starts the embedded Ray the way ``tune``
does and reports the authentication mode Ray's core runs in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE = """
from ray._raylet import AuthenticationMode, get_authentication_mode
from collage_farm.farm.connect import connect, shutdown
assert connect(num_cpus=1)
print("token" if get_authentication_mode() == AuthenticationMode.TOKEN else "off")
shutdown()
"""


def test_embedded_ray_has_token_auth_and_no_opt_out_nudge(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", CODE], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["token"]
    assert (tmp_path / ".ray" / "auth_token").stat().st_size > 0
    assert "Token authentication is enabled" not in r.stderr, r.stderr
    assert "RAY_AUTH_MODE=disabled" not in r.stderr, r.stderr
