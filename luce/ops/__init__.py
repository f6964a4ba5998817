"""Backend API the models call; numpy reference backend and GPU backends."""
