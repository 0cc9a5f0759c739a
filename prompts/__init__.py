"""Prompt templates shipped as data files (installed as ``tcrag_langgraph.prompts``)."""
