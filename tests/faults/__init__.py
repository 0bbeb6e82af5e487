"""Faults: lost servers, full disks, damaged files and rows (issue 13)."""
