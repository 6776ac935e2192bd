# gearshift's settings for the gear-placement plugin, read at broker start from
# /etc/openshift/plugins.d/openshift-origin-gear-placement.conf (or its -dev.conf
# twin in development mode), the marker file that makes the broker load the gem.
# Installed in place of the gem's stock initializer; see docs/openshift.md.
require 'openshift-origin-common'

Broker::Application.configure do
  base = File.basename(__FILE__, '.rb')
  conf_file = File.join(OpenShift::Config::PLUGINS_DIR, base + '.conf')
  if Rails.env.development?
    dev = File.join(OpenShift::Config::PLUGINS_DIR, base + '-dev.conf')
    if File.exist?(dev)
      conf_file = dev
    else
      Rails.logger.info "#{base}: no development configuration, using #{conf_file}"
    end
  end
  conf = OpenShift::Config.new(conf_file)

  # Settings passed to gearshift-broker through its environment.
  env = {}
  { 'GEARSHIFT_BUS' => 'GEARSHIFT_BUS',
    'GEARSHIFT_KEY' => 'GEARSHIFT_OPERATOR_KEY',
    'GEARSHIFT_BROKER_PUB' => 'GEARSHIFT_BROKER_PUB' }.each do |key, var|
    value = conf.get(key, '').to_s
    env[var] = value unless value.empty?
  end
  strategy = conf.get('GEARSHIFT_STRATEGY', '').to_s

  config.gear_placement = {
    :gearshift_command => conf.get('GEARSHIFT_COMMAND', '/usr/bin/gearshift-broker'),
    :gearshift_args => conf.get('GEARSHIFT_ARGS', 'place --input - --json --timeout 4s --from paas-broker'),
    :gearshift_timeout => conf.get('GEARSHIFT_TIMEOUT', '5').to_f,
    :gearshift_strategy => strategy.empty? ? nil : strategy,
    :gearshift_env => env,
    :gearshift_log_requests => conf.get_bool('GEARSHIFT_LOG_REQUESTS', 'false'),
  }
end
