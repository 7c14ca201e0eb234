"""Sensor sidecars recorded beside the video at the sensor's own rate (IMU first)."""
