"""Given step-time models, choose each node's local steps and batch size per round.

Pure Python + numpy; imports predictor/, never runtime/.
"""
