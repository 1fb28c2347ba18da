"""The batch scheduler of alpha.17 (batch_scheduler) and the action-era one (action_scheduler)."""
