# Stand-in for the broker's openshift-origin-common gem: OpenShift::Config as
# common/lib/openshift-origin-common/config.rb reads a plugin's .conf file
# (KEY=value lines, quotes stripped, get/get_bool).
module OpenShift
  class Config
    PLUGINS_DIR = ENV.fetch('STUB_PLUGINS_DIR', '/etc/openshift/plugins.d/')

    def initialize(path)
      @values = {}
      File.readlines(path).each do |line|
        line = line.strip
        next if line.empty? || line.start_with?('#') || !line.include?('=')
        key, value = line.split('=', 2)
        value = value.strip
        value = value[1..-2] if value.length >= 2 && %w[' "].include?(value[0]) && value[-1] == value[0]
        @values[key.strip] = value
      end
    end

    def get(name, default = nil)
      @values.fetch(name, default)
    end

    def get_bool(name, default = nil)
      !!(get(name, default).to_s =~ /^(true|1|yes|on)$/i)
    end
  end
end
