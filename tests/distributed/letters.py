"""A dense reward for the multi-rank VLM test: the share of letters in each answer (the tiny VLM,
barely warmed up, answers nothing right, and an all-zero reward would update nothing)."""


def letters(completions, **kwargs):
    return [sum(c.isalpha() for c in text) / max(1, len(text)) for text in completions]
