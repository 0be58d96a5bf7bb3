"""This machine: files the process reads and writes, and who the process is.

A leaf: only the standard library and the error tree, so every layer may use it.
"""
