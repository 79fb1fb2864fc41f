"""The what-if model: one training step on another device, predicted from a roofline -- never measured."""
