"""Workers that own HostClient instances and fold what they hear into the panel state."""
