"""The main job of ``make train``: a LangChain agent that learns to read the first digit (see README.md)."""
