"""Screens: the dashboard and the modal dialogs."""
