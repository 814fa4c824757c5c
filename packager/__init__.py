"""packager"""
