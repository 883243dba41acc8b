"""What operators see and tests steer: metrics, logs, crash points."""
