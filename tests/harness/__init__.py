"""CPU distributed test harness for the fork (see README.md in this directory)."""
