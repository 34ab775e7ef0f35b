"""agl-verl: verl-based algorithm backends and inference engines for agl.

Importing it sets ``OMP_WAIT_POLICY=PASSIVE`` for torch's OpenMP threads unless the
user chose a wait policy, and warns if torch was imported first (too late then); see
:mod:`agl_verl.threads`.
"""

from agl_verl.threads import prefer_passive_wait

prefer_passive_wait()  # before anything in this package imports torch

__version__ = "0.1.0"
