"""What belongs to the person at the keyboard: their settings file and what the panel remembers.

``settings`` reads ``settings.yaml`` (hosts, thresholds, notifications, keys); ``recent``
keeps each host's recent launches between sessions. Both are private to their user.
"""
