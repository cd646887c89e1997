"""Live measurement: FLOP counters (fvcore, FlopCounterMode), the cross-check, and peak memory."""
