"""Training: schedules, optimizer parameter groups and the trainer."""
