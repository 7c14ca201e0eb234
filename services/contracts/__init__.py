"""The committed contracts between the stages: JSON Schemas of the events and the AsyncAPI
document of every service's channels. Above the stages (it reads their brokers), below the CLI."""
