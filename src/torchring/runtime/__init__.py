"""The runtime engine under the public API: process groups, negotiation, execution."""
