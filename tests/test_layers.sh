#!/bin/sh
# test_layers.sh - src/'s files call each other only downward, in the Makefile's SRCS order
# (tests/layers.py says how calls are counted and what is exempt). Runtime: under a second.
exec python3 tests/layers.py
