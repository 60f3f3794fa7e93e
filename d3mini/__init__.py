"""d3mini: fast diffusion-LLM agents trained with RL, in readable single files."""
__version__ = "0.1.0"
