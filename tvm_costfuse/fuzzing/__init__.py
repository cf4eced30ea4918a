"""Differential fuzzing of the groupings only CostFuse forms: random small Relax programs
(``programs``) built under drawn groupings and targets, compared with TVM's unfused build
(``differential``). ``tests/test_fuzz.py`` runs a fixed-seed slice; ``scripts/fuzz.py`` the long
profile."""

from .differential import GROUPINGS, TARGETS, Case, check, draw_case, reference
from .programs import Draws, Program, draw_program

__all__ = ["GROUPINGS", "TARGETS", "Case", "Draws", "Program", "check", "draw_case",
           "draw_program", "reference"]
