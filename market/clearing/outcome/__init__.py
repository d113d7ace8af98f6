"""From a solution to an outcome: whole-GPU rounding, prices, fairness and efficiency figures."""
