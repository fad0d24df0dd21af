"""Sixteen short, varied prompts (prose, code, SQL, lists) for the CPU engine's tests and benchmark."""

PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "import numpy as np\nx = np.",
    "The largest planet in the solar system is",
    "My favourite book is",
    "In 1969, the first man on the moon",
    "SELECT name FROM users WHERE",
    "The quick brown fox",
    "Photosynthesis is the process by which",
    "A haiku about autumn:",
    "The meaning of life is",
    "List three fruits: apple,",
]
