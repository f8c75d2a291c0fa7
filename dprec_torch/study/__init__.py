"""The two-stage tuning study of Wang & Tang Sec. 5.1 (``python scripts/study.py``): tune on validation, report on test."""
