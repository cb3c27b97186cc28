"""Hosts: the inventory of machines the console watches, and how it reaches them."""
