"""slack"""
