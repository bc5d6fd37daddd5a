"""Renderers turn a finished ``Report`` into text; they never compute."""
