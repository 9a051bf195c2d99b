"""headway core: configs, the target model, devices. Shared by data/, heads/, train/, inference/."""
