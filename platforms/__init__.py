"""Shipped platform descriptors: one folder per platform, found by torch_fl.platform.discovery."""
