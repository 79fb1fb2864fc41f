"""The interview question bank (data) and its self-quiz widget."""
