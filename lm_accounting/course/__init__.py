"""The CS336 course write-up: the answers to transformer_accounting and adamwAccounting, from code."""
