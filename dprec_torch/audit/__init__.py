"""Empirical privacy auditing: train with and without canaries, turn guesses into a lower bound on epsilon."""
