"""The checkout the tests run from (its scripts/), as opposed to the package's own files (evalrun.config.paths)."""

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
