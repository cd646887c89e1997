"""placeholder"""
CONFIGS = {}
